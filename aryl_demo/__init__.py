"""``aryl-demo`` (``make demo``): the whole Aryl story on one machine, with fake GPUs, in real processes.

The one place that ties Aryl's programs together: it starts the scheduler, node agents, model
servers and the router as their console scripts, drives traffic and jobs through them, and reads
the cluster with ``arylctl``. Nothing in Aryl imports it; it is not part of any daemon.

Modules: ``demo`` (the story, the processes it starts and its folder), ``output`` (what it prints:
timeline lines, headings, ``arylctl`` as a user types it, the scheduler's events) and ``traffic`` (the
inference load generator through the router).
"""

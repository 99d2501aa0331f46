"""Aryl's helper for PyTorch training programs (``pip install 'aryl[torch]'``): the job contract, kept.

Nouns: the *allocation* (``Allocation``) is what the node agent tells a worker at start: its world,
its checkpoint directory and the *batch* the scheduler chose (samples per replica per pass, and the
passes accumulated per optimiser step). The *trainer* (``Trainer``) runs a DDP model's steps at that
batch, measures what the scheduler's goodput model needs (step and pass times, and the *gradient
statistics*, ``aryl_train.noise``), reports them in the progress file, checkpoints and resumes, and
answers SIGTERM with a checkpoint and exit status 0.

    allocation = Allocation.from_env(init_batch_size=64)
    dist.init_process_group("gloo")              # WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT
    model = DistributedDataParallel(net)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), allocation)
    trainer.resume()
    sys.exit(trainer.fit(total_steps, lambda batch_size: loss_of(next_samples(batch_size))))

The only module here that imports torch is ``trainer``; the contract itself is ``node_agent.contract``
(standard library). See ``examples/ddp_train.py`` for a whole program.
"""

from aryl_train.allocation import Allocation
from aryl_train.noise import GradStats, SmoothedGradStats, estimate
from aryl_train.trainer import Trainer

__all__ = ["Allocation", "GradStats", "SmoothedGradStats", "Trainer", "estimate"]

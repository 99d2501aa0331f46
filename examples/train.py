"""A pretend training program that honours Aryl's job contract (no GPU, no numpy, no Aryl install).

    python examples/train.py --total-steps 200 --step-time 0.5

What it shows a job author:
- it reads the contract's environment (WORLD_SIZE, RANK, ARYL_CHECKPOINT_DIR, ARYL_PROGRESS_FILE);
- it resumes from ``$ARYL_CHECKPOINT_DIR/checkpoint.json`` and rank 0 checkpoints every
  ``--checkpoint-every`` steps (atomically: temporary file + rename);
- on SIGTERM (preemption, resize) rank 0 checkpoints and every rank exits 0 at once;
- it acknowledges checkpoints (``acknowledge_checkpoint`` in the contract): rank 0 after each save,
  and every rank once its stop's checkpoint is saved, so the agent ends the stop then instead of at
  the end of the grace period (ranks > 0 hold no state here, so they answer at once with the last
  checkpoint they know of; a real job's other ranks answer after the barrier that follows the save);
- it reports progress (steps done, samples/s, step of the last checkpoint) for the agent;
- a step takes ``--step-time / WORLD_SIZE`` seconds, so more workers finish sooner (ideal scaling).

For tests: ``--fail-at-step K`` exits with status 3 at step K; ``--ignore-sigterm`` ignores SIGTERM
(the agent then kills it with SIGKILL after the grace period); ``--linger S`` keeps the process
running S seconds after its stop's checkpoint (a teardown that hangs, as NCCL's or a data loader's
can); ``--no-ack`` never acknowledges (what a job written before acknowledgements does).

The contract helpers are inlined (see ``node_agent/contract.py`` for the documented version) so this
file runs with plain ``python``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

EXIT_INJECTED_FAILURE = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=100, help="steps to do in all (default 100)")
    parser.add_argument("--step-time", type=float, default=0.5, help="seconds per step with one worker")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step and worker")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints (rank 0)")
    parser.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    parser.add_argument("--fail-at-step", type=int, default=0, help="exit with status 3 at this step (0: never)")
    parser.add_argument("--ignore-sigterm", action="store_true", help="ignore SIGTERM (to test SIGKILL)")
    parser.add_argument("--checkpoint-time", type=float, default=0.0,
                        help="seconds a checkpoint on SIGTERM takes (a real model's save is not instant)")
    parser.add_argument("--linger", type=float, default=0.0,
                        help="seconds to keep running after the stop's checkpoint (a hanging teardown)")
    parser.add_argument("--no-ack", action="store_true", help="never acknowledge a checkpoint")
    return parser.parse_args(argv)


# --- the job contract, inlined -------------------------------------------------------------------


def write_json_atomically(path: str, document: dict) -> None:
    temporary = f"{path}.tmp.{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(document, file)
    os.replace(temporary, path)


def report_progress(progress: float, samples_per_second: float, checkpoint_progress: float) -> None:
    path = os.environ.get("ARYL_PROGRESS_FILE")
    if path:
        write_json_atomically(path, {
            "progress": progress, "samples_per_second": samples_per_second, "checkpoint_progress": checkpoint_progress,
        })


def acknowledge_checkpoint(checkpoint_progress: float, answer_stop: bool = True) -> bool:
    """The saved checkpoint at ``checkpoint_progress``; answers the agent's stop notice if there is
    one and ``answer_stop`` (then the agent stops this worker at once: call it last). True when it
    answered a stop. A periodic save passes ``answer_stop=False``: the stop's own save comes later."""
    path = os.environ.get("ARYL_CHECKPOINT_ACK_FILE")
    if not path:
        return False
    try:
        with open(os.environ.get("ARYL_STOP_NOTICE_FILE", "") if answer_stop else "", encoding="utf-8") as file:
            stop_id = str(json.load(file)["stop_id"])
    except (OSError, ValueError, KeyError, TypeError):
        stop_id = ""  # not being stopped: only a checkpoint report
    write_json_atomically(path, {
        "checkpoint_progress": checkpoint_progress, "saved_at": time.time(),
        "incarnation": int(os.environ.get("ARYL_INCARNATION", "0")), "stop_id": stop_id,
    })
    return bool(stop_id)


# --- checkpoints ------------------------------------------------------------------------------------


def checkpoint_path() -> str:
    directory = os.environ.get("ARYL_CHECKPOINT_DIR") or "checkpoints"
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, "checkpoint.json")


def load_checkpoint() -> int:
    try:
        with open(checkpoint_path(), encoding="utf-8") as file:
            return int(json.load(file)["step"])
    except (OSError, ValueError, KeyError):
        return 0


def save_checkpoint(step: int) -> None:
    write_json_atomically(checkpoint_path(), {"step": step})


def last_saved_step() -> int:
    """The step of the checkpoint on disk (what a rank > 0, which saves nothing, can vouch for)."""
    return load_checkpoint()


# --- training ---------------------------------------------------------------------------------------


class Preempted:
    """Set by the SIGTERM handler; the training loop checks it between short sleeps."""

    requested = False

    @classmethod
    def install(cls, ignore: bool) -> None:
        if ignore:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            return

        def on_sigterm(_signum: int, _frame: object) -> None:
            cls.requested = True

        signal.signal(signal.SIGTERM, on_sigterm)


def sleep_unless_preempted(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not Preempted.requested and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.02))


def train(args: argparse.Namespace) -> int:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    Preempted.install(args.ignore_sigterm)
    step = checkpointed = load_checkpoint()
    say = lambda text: print(f"[rank {rank}/{world_size}] {text}", flush=True)  # noqa: E731
    say(f"starting at step {step} of {args.total_steps} (incarnation {os.environ.get('ARYL_INCARNATION', '-')})")
    step_seconds = args.step_time / world_size
    samples_per_second = args.batch_size * world_size / args.step_time if args.step_time > 0 else 0.0
    report_progress(step, 0.0, checkpointed)
    while step < args.total_steps:
        sleep_unless_preempted(step_seconds)
        if Preempted.requested:
            break
        step += 1
        if step == args.fail_at_step:
            say(f"injected failure at step {step}")
            return EXIT_INJECTED_FAILURE
        if rank == 0 and step % args.checkpoint_every == 0:
            save_checkpoint(step)
            checkpointed = step
            if not args.no_ack:
                acknowledge_checkpoint(checkpointed, answer_stop=False)
        report_progress(step, samples_per_second, checkpointed)
        if step % args.log_every == 0:
            say(f"step {step}/{args.total_steps}, {samples_per_second:.0f} samples/s")
    if Preempted.requested and args.checkpoint_time > 0:
        time.sleep(args.checkpoint_time)  # writing the model state out
    if rank == 0 and step != checkpointed:
        save_checkpoint(step)
        checkpointed = step
    report_progress(step, 0.0, checkpointed)
    say(f"{'preempted (SIGTERM)' if Preempted.requested else 'done'}: step {step}, checkpointed at {checkpointed}")
    if Preempted.requested and not args.no_ack:
        vouched = checkpointed if rank == 0 else last_saved_step()
        if acknowledge_checkpoint(vouched):
            say(f"acknowledged the stop: checkpoint at step {vouched} saved")
    if Preempted.requested and args.linger > 0:
        time.sleep(args.linger)  # a teardown that hangs; the agent may end it after the ack
    return 0


if __name__ == "__main__":
    sys.exit(train(parse_args()))

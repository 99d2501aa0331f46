"""Aryl on a real NVIDIA GPU: the NVML backend against the driver, an agent that registers the machine's
real GPUs (``--gpu-backend nvml``) with a real scheduler (in process, on SQLite, real gRPC), and a real
CUDA training job (``examples/ddp_train.py --device cuda``) placed by that scheduler and run by that agent.

Where NVML cannot initialise, or PyTorch sees no GPU, each test skips and says why; with
``ARYL_REQUIRE_GPU=1`` (``make gpu-check``, ``scripts/device_gpu_check.sh``) that is a failure instead, so
a GPU run that silently skipped everything cannot pass. The tests print what they saw (run with ``-s``):
the inventory, a sample, the scheduler's view of the server, the GPU's memory and utilisation while the job
ran, how long the job ran and its worker's log.

The machine needs one GPU at least; the job uses one (a world of 1: NCCL between ranks is not exercised).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

from arylctl.cli import main as arylctl
from migrations import upgrade
from node_agent.gpus import GpuBackendUnavailable, GpuInfo, NvmlBackend
from protos.aryl.v1 import types_pb2
from tests.fixtures.cluster import Cluster, end_leftovers
from tests.harness import daemon_env, job_spec
from tests.helpers import wait_for

REQUIRE_GPU_ENV = "ARYL_REQUIRE_GPU"
REPO = Path(__file__).resolve().parents[2]
DDP_TRAIN = str(REPO / "examples" / "ddp_train.py")
HOST = "gpu-node"
AGENT_GPUS = ["--gpu-backend", "nvml"]  # the real driver, never --fake-gpus
DEVICE = "cuda"
GIB = 1 << 30
J = types_pb2
T = TypeVar("T")
# The job's model: a ReLU network of 6 layers 4096 wide (84 M parameters, ~340 MB; with its gradients,
# activations and the trainer's gradient statistics ~3 GB of GPU memory), batches of 4096: tens of ms a
# step on an H200.
MODEL = ["--hidden", "4096", "--layers", "6", "--batch-size", "4096", "--lr", "0.001"]


def unavailable(reason: str) -> NoReturn:
    """Skip for want of a GPU, or fail where the run asked for one (ARYL_REQUIRE_GPU=1)."""
    if os.environ.get(REQUIRE_GPU_ENV) == "1":
        pytest.fail(f"{REQUIRE_GPU_ENV}=1, but {reason}", pytrace=False)
    pytest.skip(f"{reason} ({REQUIRE_GPU_ENV}=1 makes this a failure)")


@pytest.fixture(scope="module")
def nvml() -> Iterator[NvmlBackend]:
    """The NVML backend on this machine's driver."""
    try:
        backend = NvmlBackend()
    except GpuBackendUnavailable as exc:
        why = str(exc)  # said outside the handler: a skip or failure without the driver's exception chain
    else:
        yield backend
        backend.close()
        return
    unavailable(f"no NVIDIA GPU through NVML: {why}")


@pytest.fixture(scope="module")
def cuda(nvml: NvmlBackend) -> str:
    """PyTorch with CUDA that sees a GPU; the torch version and the first GPU's name."""
    if importlib.util.find_spec("torch") is None:
        unavailable("PyTorch is not installed")
    import torch

    if not torch.cuda.is_available():
        unavailable(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
    return f"torch {torch.__version__}, CUDA {torch.version.cuda}: {torch.cuda.get_device_name(0)}"


def nvidia_smi_inventory() -> list[GpuInfo]:
    """What ``nvidia-smi`` lists: index, UUID, name, total memory (MiB, as bytes)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        unavailable("nvidia-smi is not on PATH")
    text = subprocess.run([smi, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, check=True, timeout=30).stdout
    rows = [[field.strip() for field in line.split(",")] for line in text.splitlines() if line.strip()]
    return [GpuInfo(int(index), gpu_uuid, name, int(mib) << 20) for index, gpu_uuid, name, mib in rows]


def test_nvml_backend_lists_what_nvidia_smi_lists_and_samples_the_gpus(nvml: NvmlBackend) -> None:
    inventory = nvml.inventory()
    print("\nNVML inventory:", *inventory, sep="\n  ")
    expected = nvidia_smi_inventory()
    assert [(g.index, g.uuid, g.model) for g in inventory] == [(g.index, g.uuid, g.model) for g in expected]
    for ours, smi in zip(inventory, expected, strict=True):  # nvidia-smi rounds down to whole MiB
        assert abs(ours.memory_total_bytes - smi.memory_total_bytes) < 1 << 20, (ours, smi)
    samples = nvml.sample()
    print("NVML sample:", *samples, sep="\n  ")
    assert [s.index for s in samples] == [g.index for g in inventory]
    for sample, gpu in zip(samples, inventory, strict=True):
        assert 0.0 <= sample.utilization <= 1.0, sample
        # Idle, the driver may count its reserved memory as used or not: a job's use is checked below.
        assert 0 <= sample.memory_used_bytes <= gpu.memory_total_bytes, sample
        assert 5.0 <= sample.temperature_c <= 100.0, f"implausible temperature: {sample}"
        assert sample.healthy and sample.health_reason == "", sample


@pytest.mark.timeout(120)
def test_a_checkpoint_saved_on_the_gpu_resumes_on_the_cpu_and_back(cuda: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``aryl_train.Trainer``'s checkpoints move between devices with the same parameters; on a GPU the CUDA
    generator's state comes back too (a checkpoint from a CPU has none, and loads all the same)."""
    import torch

    from aryl_train import Allocation, Trainer

    for name in [n for n in os.environ if n.startswith("ARYL_") or n in ("WORLD_SIZE", "RANK")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ARYL_CHECKPOINT_DIR", str(tmp_path / "ck"))
    monkeypatch.setenv("ARYL_PROGRESS_FILE", str(tmp_path / "progress.json"))
    monkeypatch.setattr("signal.signal", lambda *_: None)  # the Trainer's SIGTERM handler: pytest keeps its own
    (tmp_path / "ck").mkdir()

    def trainer(device: str, seed: int) -> Trainer:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
        return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                       Allocation.from_env(init_batch_size=32), log=print)

    def train(t: Trainer, steps: int) -> None:
        device = t.device
        t.fit(t.step + steps, lambda n: (t.model(torch.randn(n, 8, device=device)) ** 2).mean())

    on_gpu = trainer("cuda", seed=1)
    assert on_gpu.device.type == "cuda"
    train(on_gpu, 5)  # saved at the end, from the GPU
    on_cpu = trainer("cpu", seed=2)
    assert on_cpu.resume() == 5 and on_cpu.checksum() == on_gpu.checksum()
    assert all(value.device.type == "cpu" for state in on_cpu.optimizer.state.values() for value in state.values()
               if isinstance(value, torch.Tensor))  # the momentum buffers came onto the CPU with the parameters
    train(on_cpu, 3)  # step 8, saved from the CPU: no CUDA generator state in it
    back = trainer("cuda", seed=3)
    assert back.resume() == 8 and back.checksum() == on_cpu.checksum()
    assert all(p.device.type == "cuda" for p in back.module.parameters())
    train(back, 2)  # step 10, saved from the GPU with the CUDA generator's state as it is now
    saved_generator = torch.cuda.get_rng_state(back.device)
    again = trainer("cuda", seed=4)  # reseeds every generator
    assert not torch.equal(torch.cuda.get_rng_state(again.device), saved_generator)
    assert again.resume() == 10 and again.checksum() == back.checksum()
    assert torch.equal(torch.cuda.get_rng_state(again.device), saved_generator)
    torch.cuda.empty_cache()  # what this process holds on the GPU stays small for the job's measures below


# --------------------------------------------------------------------------------------------------
# A real cluster: the scheduler in process on SQLite, one real aryl-agent on NVML


def start_nvml_agent(cluster: Cluster, hostname: str) -> None:
    """``aryl-agent --gpu-backend nvml`` (what ``Cluster.start_agent`` does, on the real GPUs). Its workers
    get the agent's PYTHONPATH (where Aryl and its dependencies were put, if not installed) and the loader's
    path (a container's CUDA libraries), which a worker's clean environment leaves out otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update(ARYL_AGENT__RECONCILE_INTERVAL_S="0.1", ARYL_AGENT__CHECKPOINT_ROOT=str(cluster.checkpoints),
               ARYL_AGENT__LOGS_LISTEN_HOST="127.0.0.1", ARYL_AGENT__ADVERTISE_ADDRESS="127.0.0.1",
               ARYL_USERS__PASS_ENV=json.dumps(["PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_HOME"]),
               ARYL_LOGGING__LEVEL="info", ARYL_E2E_MARKER=str(cluster.tmp), **daemon_env(hostname))
    args = [sys.executable, "-m", "node_agent.main", "--scheduler", cluster.scheduler.address,
            "--hostname", hostname, *AGENT_GPUS, "--work-dir", str(cluster.tmp / f"agent-{hostname}")]
    with (cluster.tmp / f"{hostname}.log").open("ab") as log:
        cluster.agents[hostname] = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def agent_log(cluster: Cluster, hostname: str = HOST) -> str:
    return (cluster.tmp / f"{hostname}.log").read_text(errors="replace")[-4000:]


def server(cluster: Cluster) -> types_pb2.Server | None:
    return next((s for s in cluster.client.list_servers() if s.server_id == HOST), None)


@pytest.fixture(scope="module")
def gpu_cluster(nvml: NvmlBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A scheduler and one NVML agent, shared by the tests below; the server registered and reporting."""
    tmp = tmp_path_factory.mktemp("gpu-cluster")
    url = f"sqlite:///{tmp / 'aryl.db'}"
    upgrade(url)
    cluster = Cluster(tmp, url)
    try:
        cluster.start_scheduler(scheduling={"default_grace_period_s": 60.0})
        start_nvml_agent(cluster, HOST)
        try:
            wait_for(lambda: (s := server(cluster)) is not None and s.last_seen_at.seconds > 0, timeout=60,
                     what="the NVML agent to register")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log:\n{agent_log(cluster)}") from None
        yield cluster
    finally:
        cluster.close()
        end_leftovers(tmp)


def test_an_nvml_agent_registers_the_real_gpus_with_the_scheduler(gpu_cluster: Cluster, nvml: NvmlBackend) -> None:
    registered = server(gpu_cluster)
    assert registered is not None
    print(f"\nthe scheduler's view of {HOST}:\n{registered}")
    inventory = nvml.inventory()
    assert [(g.index, g.uuid, g.model, g.memory_total_bytes) for g in registered.gpus] == [
        (g.index, g.uuid, g.model, g.memory_total_bytes) for g in inventory]
    assert registered.gpus_total == len(inventory) and registered.gpus_healthy == len(inventory)
    assert registered.gpu_type == min(g.model for g in inventory)
    # The agent's NVML samples reach the scheduler: every GPU's temperature is there.
    wait_for(lambda: all(g.temperature_c > 0 for g in s.gpus) if (s := server(gpu_cluster)) else None,
             timeout=20, what="the agent's GPU samples to reach the scheduler")
    out, err = io.StringIO(), io.StringIO()
    code = arylctl(["--server", gpu_cluster.scheduler.address, "servers", "-o", "json"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    print(f"arylctl servers -o json:\n{out.getvalue()}")
    for gpu in inventory:
        assert gpu.uuid in out.getvalue() and gpu.model in out.getvalue()


# --------------------------------------------------------------------------------------------------
# A real CUDA job


def submit_ddp(cluster: Cluster, name: str, *train_args: str) -> str:
    spec = job_spec(name, workers=1, gpus=1)
    del spec.command[:]
    spec.command.extend([sys.executable, DDP_TRAIN, "--device", DEVICE, *MODEL, *train_args])
    return cluster.client.submit_job(spec).job_id


def worker_log(cluster: Cluster, job_id: str) -> str:
    path = cluster.tmp / f"agent-{HOST}" / "logs" / job_id / "rank-0.log"
    return path.read_text(errors="replace") if path.exists() else ""


def wait_on_job(cluster: Cluster, job_id: str, predicate: Callable[[], T | None], *, timeout: float,
                what: str) -> T:
    """``wait_for``, failing with the job, its worker's log and the agent's log as they are then."""
    try:
        return wait_for(predicate, timeout=timeout, interval=0.2, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\njob {job_id}: {cluster.job(job_id)}\nits log:\n"
                             f"{worker_log(cluster, job_id)[-3000:]}\nthe agent's log:\n{agent_log(cluster)}") from None


def finished(cluster: Cluster, job_id: str, timeout: float) -> types_pb2.Job:
    terminal = (J.JOB_STATE_COMPLETED, J.JOB_STATE_FAILED, J.JOB_STATE_CANCELLED)
    job = wait_on_job(cluster, job_id, lambda: j if (j := cluster.job(job_id)).state in terminal else None,
                      timeout=timeout, what=f"job {job_id} to finish")
    assert job.state == J.JOB_STATE_COMPLETED, f"{job}\nits log:\n{worker_log(cluster, job_id)[-3000:]}"
    return job


def ran_for(job: types_pb2.Job) -> str:
    seconds = (job.finished_at.ToNanoseconds() - job.started_at.ToNanoseconds()) / 1e9
    return f"ran {seconds:.1f} s from its first start (incarnation {job.incarnation}, preemptions {job.preemptions})"


@pytest.mark.timeout(180)
def test_a_cuda_job_runs_on_the_gpu_the_agent_reports_through_nvml(gpu_cluster: Cluster, cuda: str) -> None:
    print(f"\n{cuda}")
    before = server(gpu_cluster)
    assert before is not None
    idle = {g.index: g.memory_used_bytes for g in before.gpus}
    total_steps = 300
    job_id = submit_ddp(gpu_cluster, "gpu-ddp", "--total-steps", str(total_steps), "--checkpoint-every", "150")
    seen: dict[str, Any] = {"gpu": None, "memory": 0, "utilization": 0.0, "progress": 0.0}

    def observe() -> types_pb2.Job | None:
        """Note the job's GPU's peak memory and utilisation (as the scheduler holds them, from the agent's NVML
        samples) and the job's progress; the job once all three show it working, or once it ended."""
        job = gpu_cluster.job(job_id)
        if job.state == J.JOB_STATE_RUNNING and job.workers:
            seen["gpu"] = job.workers[0].gpu_indices[0]
            seen["progress"] = max(seen["progress"], job.progress)
        if seen["gpu"] is not None and (s := server(gpu_cluster)) is not None:
            gpu = next(g for g in s.gpus if g.index == seen["gpu"])
            seen["memory"] = max(seen["memory"], gpu.memory_used_bytes)
            seen["utilization"] = max(seen["utilization"], gpu.utilization)
        terminal = job.state in (J.JOB_STATE_COMPLETED, J.JOB_STATE_FAILED, J.JOB_STATE_CANCELLED)
        return job if busy() or terminal else None

    def busy() -> bool:
        return seen["gpu"] is not None and seen["memory"] >= idle[seen["gpu"]] + GIB and \
            seen["utilization"] > 0 and seen["progress"] > 0

    running = wait_on_job(gpu_cluster, job_id, observe, timeout=120, what=f"job {job_id} busy on its GPU")
    print(f"job {job_id} on GPU {seen['gpu']}, idle {idle[seen['gpu']] / GIB:.2f} GiB used; while it ran "
          f"({J.JobState.Name(running.state)}, progress {running.progress:g}): GPU memory up to "
          f"{seen['memory'] / GIB:.2f} GiB, utilisation up to {seen['utilization']:.0%}")
    assert running.state == J.JOB_STATE_RUNNING, \
        f"the job ended before its GPU was seen busy: {running}, {seen}\nits log:\n{worker_log(gpu_cluster, job_id)}"
    assert busy(), f"while job {job_id} ran: {seen}"
    job = finished(gpu_cluster, job_id, timeout=120)
    log = worker_log(gpu_cluster, job_id)
    print(f"job {job_id}: {job.reason}, progress {job.progress:g}, {ran_for(job)}\nits log:\n{log}")
    assert job.progress == total_steps
    assert re.search(r"incarnation \d+: .*, device cuda:0 \(", log), log
    assert f"done: step {total_steps}, checkpointed at {total_steps}" in log


SAVED = re.compile(r"saved step (\d+) \(parameters (\w+)\)")
RESUMED = re.compile(r"resumed step (\d+) \(parameters (\w+)\)")


@pytest.mark.timeout(180)
def test_a_cuda_job_requeued_by_a_drain_resumes_from_its_checkpoint_on_the_gpu(gpu_cluster: Cluster,
                                                                              cuda: str) -> None:
    total_steps = 300  # the drain comes at step 50 or soon after: well before the end
    job_id = submit_ddp(gpu_cluster, "gpu-resume", "--total-steps", str(total_steps), "--checkpoint-every", "50")
    wait_on_job(gpu_cluster, job_id, lambda: SAVED.search(worker_log(gpu_cluster, job_id)), timeout=120,
                what=f"job {job_id}'s first checkpoint")
    gpu_cluster.client.drain_server(HOST, reason="test: requeue the job", force=True)
    try:
        wait_on_job(gpu_cluster, job_id, lambda: (j := gpu_cluster.job(job_id)).state == J.JOB_STATE_PENDING
                    and j.preemptions >= 1, timeout=90, what=f"job {job_id} requeued by the drain")
    finally:
        gpu_cluster.client.uncordon_server(HOST)
    job = finished(gpu_cluster, job_id, timeout=120)
    log = worker_log(gpu_cluster, job_id)
    print(f"\njob {job_id}: {job.reason}, progress {job.progress:g}, {ran_for(job)}\nits log:\n{log}")
    assert job.progress == total_steps and job.preemptions >= 1
    starts = re.findall(r"incarnation (\d+): .*, device (\S+)", log)
    assert len(starts) >= 2 and all(device == "cuda:0" for _, device in starts), starts
    saves = {(int(step), digest) for step, digest in SAVED.findall(log)}
    resumed = [(int(step), digest) for step, digest in RESUMED.findall(log)]
    assert resumed and all(r in saves for r in resumed), (resumed, saves)  # the parameters it saved, exactly
    assert resumed[0][0] >= 50
    assert f"done: step {total_steps}, checkpointed at {total_steps}" in log

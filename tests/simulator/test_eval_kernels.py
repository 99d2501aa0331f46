"""evaluation.kernels: the heterogeneity section's runs on other BLAS kernels, and only those the CPU runs."""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.kernels import kernel_spread, runnable_kernels, spread_rows


def test_only_the_kernels_whose_cpu_flag_the_machine_has(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 sse4_2 avx avx2 fma\n")
    assert runnable_kernels(cpuinfo, "x86_64") == ["Nehalem", "Sandybridge", "Haswell"]
    assert runnable_kernels(cpuinfo, "aarch64") == []                 # x86_64's kernels only
    assert runnable_kernels(tmp_path / "absent", "x86_64") == []


def test_each_kernel_runs_with_its_setting_and_one_that_left_no_figures_is_left_out(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []

    def run(argv: list[str], env: dict[str, str]) -> None:
        kernel, module = env["ARYL_SIM_BLAS_CORE"], argv[1]
        seen.append((kernel, module))
        if kernel == "SkylakeX":
            return                                           # as a run that stopped: no JSON
        out = Path(argv[argv.index("--json") + 1])
        if module == "simulator.hetero_gate":
            ours = 2700.0 if kernel == "Haswell" else 2650.0
            out.write_text(json.dumps({"saturn/workload-2": {"sia": {"ours": ours}}}))
        else:
            out.write_text(json.dumps({"philly/workload-3": {"sia": {"avg_jct_s": 2400.0},
                                                             "aryl-noloan": {"avg_jct_s": 2410.0}}}))

    spread = kernel_spread(["Haswell", "SkylakeX", "Nehalem"], ["saturn/workload-2"], ["philly/workload-3"],
                           tmp_path / "rate.csv", run=run, workers=1)
    assert sorted(seen) == sorted((k, m) for k in ("Haswell", "SkylakeX", "Nehalem")
                                  for m in ("simulator.hetero_gate", "simulator.hetero_inference"))
    assert list(spread) == ["Haswell", "Nehalem"]
    assert spread["Haswell"] == {"gate": {"saturn/workload-2": 2700.0},
                                 "beyond": {"philly/workload-3": {"sia": 2400.0, "aryl-noloan": 2410.0}}}
    pinned = {"gate": {"saturn/workload-2": 2707.2},
              "beyond": {"philly/workload-3": {"sia": 2404.8, "aryl-noloan": 2401.2}}}
    rows = spread_rows("Katmai", {"saturn/workload-2": 2574.0}, pinned, spread)
    assert rows[0] == ("| kernels | gate saturn/workload-2: `sia` (diff) | beyond philly/workload-3: `sia` | "
                       "beyond philly/workload-3: `aryl-noloan` |")
    # 2707.2 / 2574.0 = 1.0517; 2700 / 2574 = 1.0490
    assert rows[2] == "| Katmai (pinned) | 0.752 (+5.2%) | 0.668 | 0.667 |"
    assert rows[3] == "| Haswell | 0.750 (+4.9%) | 0.667 | 0.669 |"

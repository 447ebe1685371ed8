"""How torch computes on a CPU, set once per process before torch loads: which kernels
decide the bits, how many threads split a reduction, and how idle threads wait.

**The same bits on every x86-64 CPU with AVX2.** A float result depends on the kernels
that computed it: ATen picks its vector width by the CPU (``ATEN_CPU_CAPABILITY``), MKL
its code path (``MKL_CBWR``), oneDNN its instruction set (``ONEDNN_MAX_CPU_ISA``), and a
reduction split over N threads sums in another order than over M. An AVX-512 laptop, an
AVX2 one and an AMX server therefore build different starter weights from one recipe and
print different README lines. ``pinned`` fixes all four: ATen at AVX2, MKL's AVX2 branch
in strict mode, oneDNN up to AVX2, ``PINNED_THREADS`` threads; every CPU with AVX2 then
computes what an AVX2-only CPU computes (``../shared/tools/numerics-probe.py`` prints the
reference hashes of a 2-core AMD Zen 3 under these settings). ``native`` leaves the CPU
its fastest kernels (AVX-512, native bf16, all its cores): the bits are then the
machine's own.

``auto`` (the default) is ``pinned`` for the embedded starters, whose numbers the README
prints and the tests hold, and ``native`` for a real model, where speed matters more
than matching another CPU bit for bit. ``--numerics`` on every command, or
``POSTTRAIN_NUMERICS``, chooses; an ``OMP_NUM_THREADS`` you set is kept either way (and
is part of the bits: say so when comparing).

**Threads that do not stall.** OpenMP's default is to spin while waiting for the other
threads of a parallel region; beside one busy process on two cores a spinning thread
burns the time its descheduled partner needs (a matmul loop: 139 s spinning, 15 s
sleeping). Every command sets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment names
a policy (``OMP_WAIT_POLICY=ACTIVE`` restores spinning).

These are environment variables torch's libraries read once, when they load: this module
imports nothing heavy, and ``set_up_cpu`` refuses nothing but says when it came too late
(torch was already loaded by the process, as in a test run that imported it first).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass, field

NUMERICS = ("auto", "pinned", "native")
#: the environment variable that chooses the mode where no flag does
NUMERICS_VARIABLE = "POSTTRAIN_NUMERICS"
#: what decides the bits, pinned to what every x86-64 CPU with AVX2 computes
PINNED_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
#: the threads a pinned process splits its work over (the starters' builds always used 2)
PINNED_THREADS = 2
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class CpuSetup:
    """What a process's numerics are and why (said in a run's config)."""

    mode: str  # pinned | native
    reason: str
    threads: str  # the thread count, or "the CPU's cores"
    applied: dict[str, str] = field(default_factory=dict)  # variables this process set
    late: bool = False  # torch had loaded before: the process keeps what it had

    def to_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "reason": self.reason, "threads": self.threads,
                "applied": dict(self.applied), "late": self.late}


def choose_numerics(asked: str | None, *, embedded_model: bool,
                    environ: MutableMapping[str, str] | None = None) -> tuple[str, str]:
    """``pinned`` or ``native`` for ``--numerics asked`` (None: not given, so
    ``POSTTRAIN_NUMERICS``, else ``auto``), and why. ``embedded_model``: the command runs
    one of the embedded starters (or no model at all)."""
    environ = os.environ if environ is None else environ
    source = "--numerics"
    if asked is None:
        asked, source = environ.get(NUMERICS_VARIABLE, "auto") or "auto", NUMERICS_VARIABLE
    if asked not in NUMERICS:
        raise ValueError(f"{source} {asked!r}: expected one of {', '.join(NUMERICS)}")
    if asked != "auto":
        return asked, f"{source} {asked}"
    if embedded_model:
        return "pinned", ("auto: an embedded starter, whose numbers are the same on every "
                          "CPU with AVX2")
    return "native", "auto: a real model, on this CPU's fastest kernels"


def set_up_cpu(mode: str, reason: str, *,
               environ: MutableMapping[str, str] | None = None,
               previous: CpuSetup | None = None,
               torch_loaded: bool | None = None) -> CpuSetup:
    """Set the process's numerics (``mode``: pinned or native) and passive waiting in
    ``environ`` (the process's own by default), before torch loads. A variable the
    environment already names for the thread count or the wait policy is kept;
    ``previous``: an earlier set-up of this process, whose variables are taken back
    first (before torch loads, a command may learn it runs another model).
    ``torch_loaded``: whether torch is loaded already (default: this process's answer);
    then nothing is set, and the set-up says so."""
    environ = os.environ if environ is None else environ
    late = "torch" in sys.modules if torch_loaded is None else torch_loaded
    if previous is not None and not late:
        for name, value in previous.applied.items():
            if environ.get(name) == value:
                del environ[name]
    applied: dict[str, str] = {}
    if "OMP_WAIT_POLICY" not in environ:
        applied["OMP_WAIT_POLICY"] = "PASSIVE"
    given_threads = environ.get("OMP_NUM_THREADS")
    if mode == "pinned":
        applied.update(PINNED_KERNELS)
        if given_threads is None:
            applied.update({name: str(PINNED_THREADS) for name in THREAD_VARIABLES})
    threads = (given_threads or (str(PINNED_THREADS) if mode == "pinned"
                                 else "the CPU's cores"))
    if not late:
        environ.update(applied)
    return CpuSetup(mode, reason, threads, applied if not late else {}, late)


def describe_process_numerics(environ: MutableMapping[str, str] | None = None
                              ) -> dict[str, str | None]:
    """The variables that decide this process's numerics, as its environment has them
    (for a run's config.json: a reader can rerun under the same)."""
    environ = os.environ if environ is None else environ
    names = (*PINNED_KERNELS, *THREAD_VARIABLES, "OMP_WAIT_POLICY", NUMERICS_VARIABLE)
    return {name: environ.get(name) for name in names}


def pinned_in(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether ``environ`` (the process's by default) holds the pinned kernels: a build
    made under them has the same bits on every CPU with AVX2 (a cache keys on it)."""
    environ = os.environ if environ is None else environ
    return all(environ.get(name) == value for name, value in PINNED_KERNELS.items())


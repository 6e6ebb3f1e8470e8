"""Where the JAX reference runs, as data: its backend and device, whether it is simulated, the float32 matmul
precision asked for and what that means there, and whose normals it draws (issue 32).

JAX's `default` matmul precision is TF32 on NVIDIA GPUs of compute capability 8.0 and above ("default" and "high"
alike: operands rounded to 10 mantissa bits, float32 sums) and float32 on the CPU; `highest` is float32 everywhere.
JAX's float32 normal differs between its CPU and GPU backends by a few ULP in about 5% of draws (XLA lowers erf_inv
differently), while its random bits are the same. Every suite takes the same two flags (`add_reference_flags`),
resolves them into one `ReferencePlatform` (`jax_reference.platform.resolve`) and states it in its report
(`sentence()`, `fields()`). `gpu-sim` runs the reference on the CPU as on such a GPU: operands rounded to TF32 at
`default`, JAX's GPU normals. Standard library only.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

PLATFORMS = ("auto", "cpu", "gpu-sim")
PRECISIONS = ("default", "highest")
TF32_MIN_CAPABILITY = (8, 0)        # Ampere and later: JAX's default float32 matmul runs on TF32 tensor cores
TF32_UNIT = "2^-11"                 # TF32's unit roundoff: 10 stored mantissa bits, round to nearest
SIMULATED_GPU = "an NVIDIA GPU of compute capability >= 8.0"
# jax_default_matmul_precision values that keep float32 products on a GPU; the others (None, default, high,
# tensorfloat32, bfloat16*) let an NVIDIA GPU of capability >= 8.0 use TF32.
FLOAT32_SETTINGS = ("highest", "float32")


@dataclass(frozen=True)
class ReferencePlatform:
    """The JAX reference's platform as a report states it.

    backend: JAX's backend the reference's arrays live on ("cpu" or "gpu"); device: that device's kind;
    compute_capability: "9.0" on CUDA, else None; simulated: gpu-sim (the CPU computing as the GPU would);
    requested: the platform asked for (auto, cpu, gpu-sim); precision_requested: default or highest;
    precision: what it resolves to ("tf32" or "float32"); normals: whose float32 normals it draws ("cpu", "gpu").
    """

    backend: str = "cpu"
    device: str = "cpu"
    compute_capability: str | None = None
    simulated: bool = False
    requested: str = "auto"
    precision_requested: str = "default"
    precision: str = "float32"
    normals: str = "cpu"

    @property
    def tf32(self) -> bool:
        """Whether the reference's float32 products round their operands to TF32 (its bounds use u = 2^-11)."""
        return self.precision == "tf32"

    def replace(self, **changes) -> "ReferencePlatform":
        return dataclasses.replace(self, **changes)

    def where(self) -> str:
        """'JAX on gpu (NVIDIA H100 80GB HBM3, compute capability 9.0)', or the simulation's words."""
        if self.simulated:
            return f"JAX on cpu simulating {SIMULATED_GPU} (gpu-sim)"
        cc = f", compute capability {self.compute_capability}" if self.compute_capability else ""
        kind = f" ({self.device}{cc})" if self.device != self.backend else ""
        return f"JAX on {self.backend}{kind}"

    def precision_words(self) -> str:
        """What the reference's float32 matmuls are, and why."""
        if self.precision == "float32":
            why = ("pinned by --reference-precision highest" if self.precision_requested == "highest"
                   else f"JAX's default on {'the CPU' if self.backend == 'cpu' and not self.simulated else 'it'}")
            return f"float32 matmuls ({why})"
        how = ("operands rounded to TF32 by lax.reduce_precision: 8 exponent, 10 mantissa bits" if self.backend == "cpu"
               else "JAX's default on NVIDIA GPUs of compute capability >= 8.0")
        return f"TF32 matmuls at precision default ({how})"

    def sentence(self, bounds: bool = True) -> str:
        """The report's one sentence on the reference's platform (bounds: say how a TF32 reference is judged)."""
        judged = ("; its products, forwards and gradients are judged by the TF32 bound (u = 2^-11 for each "
                  "rounded operand), so the port is never held to the reference's own rounding") if (
            self.tf32 and bounds) else ""
        table = " (by table)" if self.normals != self.backend else ""
        return (f"Reference platform: {self.where()}; {self.precision_words()}; JAX's {self.normals.upper()} "
                f"normals{table}{judged}.")

    def fields_text(self) -> str:
        """The fields in one line (a report's run section)."""
        cc = self.compute_capability or "-"
        return (f"backend {self.backend}, device {self.device}, compute capability {cc}, simulated {self.simulated}, "
                f"requested {self.requested}, precision {self.precision_requested} -> {self.precision}, "
                f"normals {self.normals}")

    def fields(self) -> dict:
        """The platform as a report's or a manifest's fields (JSON)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_fields(cls, fields: dict) -> "ReferencePlatform":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in fields.items() if k in known})


def backend_sentence(port_normals: str, platform: ReferencePlatform) -> str:
    """Why a side on the other backend's normals departs: the bits agree, the backend's float32 normal does not."""
    return (f"the port draws JAX's {port_normals.upper()} normals, the reference JAX's {platform.normals.upper()} "
            f"normals ({platform.where()}): the same threefry bits through another backend's float32 normal (XLA "
            "lowers erf_inv differently on a GPU: a few ULP in about 5% of draws), so it is the backend, not the key "
            "scheme")


def recorded_platform(manifest: dict) -> ReferencePlatform:
    """The platform a bundle's manifest records (`platform` fields); a bundle recorded before they existed says only
    its backend ('JAX reference on cpu'), read as JAX's default there."""
    if isinstance(manifest.get("platform"), dict):
        return ReferencePlatform.from_fields(manifest["platform"])
    gpu = " on gpu" in str(manifest.get("device", ""))
    return ReferencePlatform(backend="gpu" if gpu else "cpu", device="gpu" if gpu else "cpu",
                             precision="tf32" if gpu else "float32", normals="gpu" if gpu else "cpu")


def resolve_precision(backend: str, compute_capability: str | None, requested: str, setting: str | None = None,
                      simulated: bool = False) -> str:
    """'tf32' or 'float32': what `requested` (default or highest) means on this backend, given JAX's own
    jax_default_matmul_precision `setting` (None: unset), which `default` leaves as the user has it."""
    if requested == "highest" or (setting or "").lower() in FLOAT32_SETTINGS and not simulated:
        return "float32"
    if simulated:
        return "tf32"
    if backend != "gpu" or not compute_capability:
        return "float32"
    try:
        major, minor = (int(p) for p in str(compute_capability).split(".")[:2])
    except ValueError:
        return "float32"
    return "tf32" if (major, minor) >= TF32_MIN_CAPABILITY else "float32"


# ---------------------------------------------------------------- the flags every suite shares
def _choice(flag: str, choices: tuple[str, ...], meaning: str):
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"unknown {flag} {text!r}; use one of {', '.join(choices)} ({meaning})")
        return text
    parse.__name__ = flag.lstrip("-").replace("-", "_")
    return parse


PLATFORM_MEANING = ("auto: where JAX runs; cpu: JAX's CPU device; gpu-sim: the CPU computing as an NVIDIA GPU does, "
                    "TF32 operands at default precision and JAX's GPU normals")
PRECISION_MEANING = ("default: what the user's JAX does (TF32 on NVIDIA GPUs of compute capability >= 8.0, float32 on "
                     "the CPU); highest: float32 products everywhere")
platform_arg = _choice("--reference-platform", PLATFORMS, PLATFORM_MEANING)
precision_arg = _choice("--reference-precision", PRECISIONS, PRECISION_MEANING)


def add_reference_flags(parser: argparse.ArgumentParser) -> None:
    """--reference-platform and --reference-precision (None when not given, so a bundle can refuse them)."""
    parser.add_argument("--reference-platform", type=platform_arg, default=None, metavar="{auto,cpu,gpu-sim}",
                        help=f"where the JAX reference runs (default auto). {PLATFORM_MEANING}")
    parser.add_argument("--reference-precision", type=precision_arg, default=None, metavar="{default,highest}",
                        help=f"the reference's float32 matmul precision (default default). {PRECISION_MEANING}")


@dataclass(frozen=True)
class PlatformRequest:
    """What the command line asked of the reference's platform (the flags' values, defaults filled in)."""

    platform: str = "auto"
    precision: str = "default"


def request_of(args) -> PlatformRequest:
    return PlatformRequest(getattr(args, "reference_platform", None) or "auto",
                           getattr(args, "reference_precision", None) or "default")


def check_against_bundle(args, recorded: ReferencePlatform, bundle: str) -> None:
    """ValueError when --reference-platform (other than auto) or --reference-precision comes with --against: the
    bundle fixes both; the message names what it was recorded on."""
    given = [f"--reference-platform {args.reference_platform}"] if getattr(args, "reference_platform", None) not in (
        None, "auto") else []
    given += [f"--reference-precision {args.reference_precision}"] if getattr(args, "reference_precision", None) else []
    if given:
        raise ValueError(f"{' and '.join(given)} with --against {bundle}: the bundle fixes the reference's platform "
                         f"and precision; it was recorded on {recorded.where()} with {recorded.precision_words()} and "
                         f"JAX's {recorded.normals.upper()} normals. Drop the flag, or record a bundle on the platform "
                         f"you want (python -m parity record ... --reference-platform gpu-sim), or check against the "
                         f"live reference (drop --against)")


def compile_cache_settings() -> dict:
    """JAX's persistent compilation cache as the reference keeps it: {jax config name: value}, the directory
    ~/.cache/eggroll-parity/jax (or under $XDG_CACHE_HOME) and thresholds that keep every compile; {} where that
    directory cannot be made (a read-only home: no cache). Every live reference sets these through jax.config
    (parity.core.platform.enable_compile_cache), tests/conftest.py as environment variables before JAX loads."""
    import os

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "eggroll-parity", "jax")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return {}
    # Every compile kept, the op-by-op ones of a few milliseconds too: each process (a test worker, a subprocess, the
    # next command) compiles the same small ones again otherwise. Measured on tests/parity/tree/test_lm.py run twice on
    # one core: the second run 49 s with a 0.05 s threshold, 41 s with none; the first 89 s either way.
    return {"jax_compilation_cache_dir": path, "jax_persistent_cache_min_compile_time_secs": 0.0,
            "jax_persistent_cache_min_entry_size_bytes": 0}

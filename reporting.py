"""What every report of the project says the same way: versions, the machine, numbers, tables, float agreement,
and files written whole. Shared by the suite, the gap study and the benchmark; imports nothing of ours."""
from __future__ import annotations

import math
import os
import platform
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

PACKAGES = ("torch", "jax", "jaxlib", "numpy", "scipy")


def versions(packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """Python's and the installed packages' versions, from package metadata (no heavy imports)."""
    out = {"python": platform.python_version()}
    for dist in packages:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def xla_flags() -> str:
    """XLA_FLAGS as this process has them ('' where unset). They can change how JAX compiles and so the reference's
    bits (an optimization level, fast math), so every report states them."""
    return os.environ.get("XLA_FLAGS", "").strip()


def xla_flags_text(flags: str) -> str:
    """XLA_FLAGS `flags` in a report's words: quoted, or that XLA runs at its defaults."""
    return f"`{flags}`" if flags else "unset (XLA's defaults)"


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> str:
    """One line: OS, architecture, CPU model and core count."""
    return f"{platform.platform()}, {platform.machine()}, {cpu_name()}, {os.cpu_count()} CPU cores"


def fmt(value: float | None, digits: int = 4, grouped: bool = False) -> str:
    """Numbers for tables: `digits` significant digits, integers plainly; `grouped`: thousands separated."""
    if value is None:
        return ""
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if grouped:
        return "0" if value == 0 else f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"
    if value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.{digits}g}"


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub Markdown table; pipes and newlines in cells are escaped."""
    def cell(x: object) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def atomic_write(path: Path | str, text: str) -> None:
    """Write text to path through a temporary file in the same folder and an atomic rename (never half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)          # mkstemp creates 0600; reports are ordinary files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------- float agreement
def ulp_distance(a, b):
    """How many float32 values lie between a and b, element by element (0 = bit-identical up to the sign of 0).

    Takes anything numpy reads (torch tensors on the CPU included); returns an int64 numpy array.
    """
    import numpy as np

    a = np.ascontiguousarray(np.asarray(a), dtype=np.float32)
    b = np.ascontiguousarray(np.asarray(b), dtype=np.float32)
    if a.shape != b.shape:
        raise ValueError(f"cannot compare arrays of shapes {a.shape} and {b.shape}")

    def ordered(x):                        # sign-magnitude bits -> integers in the order of the floats
        bits = x.view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    return np.abs(ordered(a) - ordered(b))


class Agreement(NamedTuple):
    draws: int                  # values compared
    identical_fraction: float   # share of bit-identical values
    max_ulp: int                # largest distance in units in the last place (float32)

    def __str__(self) -> str:
        return f"{self.draws} draws: {100 * self.identical_fraction:.4f}% bit-identical, max {self.max_ulp} ULP"


def agreement(ours, theirs) -> Agreement:
    """How closely two float32 arrays of equal shape agree: bit-identical share and worst ULP distance."""
    d = ulp_distance(ours, theirs)
    if d.size == 0:
        return Agreement(0, 1.0, 0)
    return Agreement(int(d.size), float((d == 0).mean()), int(d.max()))

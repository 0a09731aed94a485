"""The DP-SGD noise on the CPU at a fraction of the cost of ``Tensor.normal_``.

Why. At two threads ``aten::normal_`` is ~21 % of the book-keeping MLP step (issue 15,
``benchmarks/results/issue15_cpu.md``): ATen's CPU Gaussian is one MT19937 stream, serial by
construction, so the second core waits while the step's only large serial kernel runs, and a
Python thread cannot take the work (OpenMP's worker spins on the second core after every
parallel region). A counter-based generator has no such chain: every block of output is a
pure function of (key, counter), so any thread can compute any part of the draw.

What. :func:`gaussian_` fills a float32 CPU tensor with N(0, std²) values from
Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3",
SC 2011; one of cuRAND's generators and the engine of torch's CUDA generator) and the
Box–Muller transform, in a small C kernel (``_gaussian_kernel.c``: AVX2, glibc's vector
``logf``/``cosf``/``sinf``; AVX-512 where torch reports it) that runs on the OpenMP runtime
torch itself uses, with ``torch.get_num_threads()`` threads. Measured on the 2-core CI machine for the 78 858-value MLP
(``benchmarks/gaussian_kernel.py``): see that script's docstring.

The stream. Each call draws four 32-bit words (k0, k1, n0, n1) from ``generator`` (the
secret-seeded torch generator, :mod:`raydp_hpo.trainables.secret_rng`), so the key of the
release is 128 secret bits and the noise is as reproducible, and as resumable, as the
generator's state. Block b of the call uses the Philox counter (b mod 2³², ⌊b/2³²⌋, n0, n1)
under the key (k0, k1); its four output words (x0, x1, x2, x3) make two uniform pairs, with
u1 = (⌊x/2⁸⌋ + 1)·2⁻²⁴ ∈ (0, 1] and u2 = ⌊x/2⁸⌋·2⁻²⁴ ∈ [0, 1) (24-bit uniforms, exact in
float32, as ATen's ``normal_``), and each pair gives std·√(−2 ln u1)·(cos 2πu2, sin 2πu2).
Group g of 16 blocks writes out[64g .. 64g + 63] (:func:`reference_gaussian` spells out the
order); the values depend only on the index, never on the thread count or the vector width
(AVX2 and AVX-512 differ only in libmvec's last-bit rounding).

The law, and what the privacy argument needs from it. Box–Muller maps two independent
uniforms on (0, 1] × [0, 1) to two independent N(0, 1) values (Box & Muller 1958); here, as in
ATen's CPU kernel and cuRAND, the uniforms have 24 bits and the result is float32, so |z| ≤
√(2 ln 2²⁴) = 5.77 and the law is N(0, 1) up to that discretisation — the floating-point
caveat every DP-SGD implementation outside a "secure mode" shares (Mironov, CCS 2012; Opacus'
``secure_mode``), and no weaker than ``normal_``. The uniforms are independent if the Philox
outputs are: Philox4x32 passes TestU01's BigCrush with fewer rounds than the 10 used here
(Salmon et al. 2011, who recommend 10 as the safety margin), a fresh 128-bit key and nonce per release makes a collision of two
releases' streams a 2⁻¹²⁸-per-pair event, and within a release every block has a different
counter. Like MT19937 it is not a cryptographic generator; the position of
:mod:`raydp_hpo.trainables.secret_rng` (the noise is never observed without the data's
contribution) is unchanged.

When it is used. CPU, float32, contiguous tensor, x86-64 Linux whose CPU torch reports as AVX2
or AVX-512, a C compiler and glibc's libmvec at first use (the library is built once into
``$RAYDP_HPO_CACHE``, else ``$XDG_CACHE_HOME/raydp_hpo``, else ``~/.cache/raydp_hpo``, in
~0.4 s here, then loaded; where that directory cannot be written, into a fresh private
temporary directory of the process), and three known-answer vectors of Random123 plus a comparison with
:func:`reference_gaussian` pass at load. Anywhere else — GPU, float64, no compiler,
``RAYDP_HPO_NATIVE_NOISE=0`` — :func:`gaussian_` is ``out.normal_(0, std, generator)``: the
same law, a different stream. :func:`native_status` says which, and why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

#: The C source of the kernel, shipped beside this module.
SOURCE = Path(__file__).with_name("_gaussian_kernel.c")
#: Set to 0 / false / off to always use ``Tensor.normal_``.
DISABLE_ENV = "RAYDP_HPO_NATIVE_NOISE"
CACHE_ENV = "RAYDP_HPO_CACHE"

#: Random123's known answers for Philox4x32-10 (``kat_vectors``): counter, key, output.
PHILOX_KNOWN_ANSWERS: tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...] = (
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
)

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = 0xFFFFFFFF
#: |reference − kernel| ≤ this · std: libmvec's logf/cosf/sinf and numpy's are each within a
#: few float32 ulp (~1e-7 relative) of the exact values, on outputs of magnitude ≤ 5.77.
REFERENCE_TOLERANCE = 1e-5


@dataclass(frozen=True)
class NativeStatus:
    """Whether :func:`gaussian_` uses the native kernel here, and why not if it does not."""

    available: bool
    reason: str
    library: str | None = None


def gaussian_(out: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """Fill ``out`` with i.i.d. N(0, std²) values drawn with ``generator``; return ``out``.

    The native stream of the module docstring where it applies (float32, contiguous, CPU,
    :func:`native_status` available), else ``out.normal_(0.0, std, generator=generator)``.
    Either way the values are a function of ``generator``'s state, which advances.
    """
    kernel = _kernel() if _native_applies(out, generator) else None
    if kernel is None:
        return out.normal_(0.0, std, generator=generator)
    k0, k1, n0, n1 = draw_key(generator)
    kernel.raydp_philox_gaussian(
        out.data_ptr(), out.numel(), k0, k1, n0, n1, float(std), torch.get_num_threads(),
        _wide(),
    )
    return out


def draw_key(generator: torch.Generator) -> tuple[int, int, int, int]:
    """The four secret 32-bit words (k0, k1, n0, n1) of one native draw, from ``generator``."""
    words = torch.empty(4, dtype=torch.int64).random_(0, 2**32, generator=generator).tolist()
    return words[0], words[1], words[2], words[3]


def _native_applies(out: torch.Tensor, generator: torch.Generator) -> bool:
    return (
        out.device.type == "cpu"
        and out.dtype == torch.float32
        and out.is_contiguous()
        and generator.device.type == "cpu"
        and out.numel() > 0
    )


def native_status() -> NativeStatus:
    """Whether the native kernel is in use in this process (building it on first call)."""
    return _loaded()[1]


def _kernel() -> ctypes.CDLL | None:
    """The loaded, self-tested kernel, or None (the reason in :func:`native_status`)."""
    return _loaded()[0]


@functools.cache
def _loaded() -> tuple[ctypes.CDLL | None, NativeStatus]:
    """Build, load and self-test the kernel once per process; warn once if it is not used
    (unless it was turned off on purpose)."""
    reason = _unsupported_reason()
    library = None
    if reason is None:
        try:
            library = _build()
            kernel = _load(library)
            _self_test(kernel)
        except (OSError, RuntimeError, subprocess.SubprocessError, AssertionError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
    if reason is None:
        return kernel, NativeStatus(True, "native Philox4x32-10 kernel", str(library))
    if not _disabled():
        warnings.warn(
            f"raydp_hpo: the native Gaussian kernel is not used ({reason}); DP-SGD noise "
            "is drawn with torch's normal_ (the same law, slower on the CPU)",
            RuntimeWarning,
            stacklevel=4,
        )
    return None, NativeStatus(False, reason, str(library) if library else None)


def _disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").lower() in ("0", "false", "off")


def _unsupported_reason() -> str | None:
    if _disabled():
        return f"disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]}"
    if not sys.platform.startswith("linux"):
        return f"platform {sys.platform} (the kernel needs Linux and glibc's libmvec)"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"machine {platform.machine()} (the kernel is written for x86-64 AVX2)"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"torch reports CPU capability {capability}, the kernel needs AVX2"
    return None


def _openmp_runtime() -> str | None:
    """The OpenMP runtime torch's own kernels call (libgomp, libiomp5 or libomp), linked into
    the kernel so that it runs on the same thread pool: a second runtime would bring a second
    set of threads competing with torch's for the same cores. Found as the file that
    ``GOMP_parallel`` resolves to from ``libtorch_cpu`` (other libraries, e.g. scikit-learn,
    may have loaded a libgomp of their own); None if torch has no OpenMP runtime (the kernel
    is then built single-threaded)."""
    libtorch = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    if not libtorch.exists():
        return None
    return _symbol_file(ctypes.CDLL(str(libtorch)), "GOMP_parallel")


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _symbol_file(library: ctypes.CDLL, symbol: str) -> str | None:
    """The file of the object that ``symbol`` binds to when looked up from ``library``."""
    libc = ctypes.CDLL(None)
    libc.dlsym.restype = ctypes.c_void_p
    libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    address = libc.dlsym(library._handle, symbol.encode())
    info = _DlInfo()
    if not address or not libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)):
        return None
    return os.path.realpath(info.dli_fname.decode()) if info.dli_fname else None


def _cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "raydp_hpo"


def _build() -> Path:
    """Compile the kernel once per (source, compiler command, OpenMP runtime) into the cache;
    written to a temporary name and renamed, so concurrent builders cannot see a torn file."""
    cc = os.environ.get("CC", "cc")
    omp = _openmp_runtime()
    compile_flags = ["-O3", "-std=c99", "-mavx2", "-mfma", "-fPIC"]
    if omp:
        compile_flags.append("-fopenmp")
    # -z defs: a symbol left unresolved (an OpenMP ABI the runtime does not export, e.g. a
    # compiler emitting __kmpc_* calls against libgomp) fails the build, not a later call
    link = ["-Wl,-z,defs", "-lmvec", "-lm"] + (
        [omp, f"-Wl,-rpath,{os.path.dirname(omp)}"] if omp else [])
    digest = hashlib.sha256(
        SOURCE.read_bytes() + repr((cc, compile_flags, link)).encode()
    ).hexdigest()[:16]
    name = f"gaussian_kernel_{digest}.so"
    target = _cache_dir() / name
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=target.parent)
    except OSError:
        # an unwritable cache (read-only home): build into a fresh private directory for this
        # process (mkdtemp: mode 0700, an unpredictable name), not into a shared guessable path
        tmp = tempfile.mkdtemp(prefix="raydp_hpo-")
        target = Path(tmp) / name
    obj, lib = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
    for cmd in (
        [cc, *compile_flags, "-c", str(SOURCE), "-o", str(obj)],
        # linked without -fopenmp: the compiler would add its own libgomp
        [cc, "-shared", str(obj), "-o", str(lib), *link],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
    os.replace(lib, target)
    obj.unlink(missing_ok=True)
    if target.parent != Path(tmp):
        Path(tmp).rmdir()
    return target


def _load(library: Path) -> ctypes.CDLL:
    kernel = ctypes.CDLL(str(library))
    u32 = ctypes.c_uint32
    kernel.raydp_philox_gaussian.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, u32, u32, u32, u32, ctypes.c_float, ctypes.c_int,
        ctypes.c_int,
    ]
    kernel.raydp_philox_gaussian.restype = None
    kernel.raydp_philox4x32_10.argtypes = [ctypes.POINTER(u32)] * 3
    kernel.raydp_philox4x32_10.restype = None
    return kernel


def native_philox(kernel: ctypes.CDLL, counter: tuple[int, ...], key: tuple[int, ...]) -> tuple[
        int, ...]:
    """One Philox4x32-10 block computed by the native kernel (for the known-answer tests)."""
    ctr = (ctypes.c_uint32 * 4)(*counter)
    k = (ctypes.c_uint32 * 2)(*key)
    out = (ctypes.c_uint32 * 4)()
    kernel.raydp_philox4x32_10(ctr, k, out)
    return tuple(out)


def _self_test(kernel: ctypes.CDLL) -> None:
    """Refuse a kernel that does not reproduce Random123's answers or the reference stream
    (a miscompiled generator must not silently become the DP noise)."""
    for counter, key, expected in PHILOX_KNOWN_ANSWERS:
        got = native_philox(kernel, counter, key)
        if got != expected:
            raise RuntimeError(f"Philox known-answer test failed: {got} != {expected}")
    words = (0x01234567, 0x89ABCDEF, 0xDEADBEEF, 0x0BADF00D)
    reference = reference_gaussian(150, words, 1.5)
    for wide in sorted({0, _wide()}):
        out = torch.empty(150)
        kernel.raydp_philox_gaussian(out.data_ptr(), 150, *words, 1.5, 1, wide)
        if not np.allclose(out.numpy(), reference, rtol=0, atol=REFERENCE_TOLERANCE * 1.5):
            raise RuntimeError(
                f"the native Gaussian stream ({'AVX-512' if wide else 'AVX2'}) differs from "
                "the reference"
            )


@functools.cache
def _wide() -> int:
    """1 where torch dispatches its own kernels to AVX-512 (it checked the CPU and the OS),
    else 0 (AVX2)."""
    return int(torch.backends.cpu.get_cpu_capability() == "AVX512")


def philox4x32_10(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of Salmon et al. (2011) in numpy: ``counter`` is (m, 4) uint32, the
    result the (m, 4) output words. Each round: (hi0, lo0) = M0·c0, (hi1, lo1) = M1·c2,
    c ← (hi1 ⊕ c1 ⊕ k0, lo1, hi0 ⊕ c3 ⊕ k1, lo0); then k ← k + (W0, W1) mod 2³²."""
    c = counter.astype(np.uint64)
    k0, k1 = int(key[0]), int(key[1])
    for _ in range(10):
        p0 = c[:, 0] * np.uint64(_M0)
        p1 = c[:, 2] * np.uint64(_M1)
        c = np.stack([
            (p1 >> np.uint64(32)) ^ c[:, 1] ^ np.uint64(k0),
            p1 & np.uint64(_MASK),
            (p0 >> np.uint64(32)) ^ c[:, 3] ^ np.uint64(k1),
            p0 & np.uint64(_MASK),
        ], axis=1)
        k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return c.astype(np.uint32)


def reference_gaussian(n: int, words: tuple[int, int, int, int], std: float) -> np.ndarray:
    """The native stream for key words ``words`` = (k0, k1, n0, n1), in numpy (float32
    arithmetic as the kernel does it, numpy's transcendental functions instead of libmvec's:
    equal to :data:`REFERENCE_TOLERANCE`·std)."""
    k0, k1, n0, n1 = words
    groups = -(-n // 64)
    blocks = np.arange(16 * groups, dtype=np.uint64)
    counter = np.stack([
        blocks & np.uint64(_MASK), blocks >> np.uint64(32),
        np.full_like(blocks, n0), np.full_like(blocks, n1),
    ], axis=1)
    x = philox4x32_10(counter, (k0, k1)).reshape(groups, 16, 4)  # group, block, word
    ulp = np.float32(2.0**-24)
    out = np.empty((groups, 2, 2, 16), dtype=np.float32)  # group, pair, (cos, sin), block
    for h in range(2):
        u1 = ((x[:, :, 2 * h] >> 8).astype(np.float32) + np.float32(1)) * ulp
        u2 = (x[:, :, 2 * h + 1] >> 8).astype(np.float32) * ulp
        radius = np.sqrt(np.float32(-2) * np.log(u1)) * np.float32(std)
        theta = np.float32(2 * np.pi) * u2
        out[:, h, 0] = radius * np.cos(theta)
        out[:, h, 1] = radius * np.sin(theta)
    return out.reshape(-1)[:n]

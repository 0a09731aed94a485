"""The native DP-SGD noise kernel: Philox4x32-10 against Random123's known answers (in numpy
and in C), the C stream against its numpy reference, the law of its output, where its
secret comes from, and the fall-back to ``normal_``."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from raydp_hpo.trainables import gaussian_kernel as gk
from raydp_hpo.trainables.gaussian_kernel import (
    PHILOX_KNOWN_ANSWERS,
    REFERENCE_TOLERANCE,
    draw_key,
    gaussian_,
    native_status,
    philox4x32_10,
    reference_gaussian,
)
from raydp_hpo.trainables.secret_rng import secret_generator

SUPPORTED_HERE = (
    sys.platform.startswith("linux")
    and os.uname().machine == "x86_64"
    and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    and shutil.which(os.environ.get("CC", "cc")) is not None
    and os.environ.get(gk.DISABLE_ENV, "1").lower() not in ("0", "false", "off")
)
native = pytest.mark.skipif(not native_status().available,
                            reason=f"native kernel not used here: {native_status().reason}")


@pytest.mark.parametrize(("counter", "key", "expected"), PHILOX_KNOWN_ANSWERS)
def test_reference_philox_reproduces_random123_known_answers(counter, key, expected):
    out = philox4x32_10(np.array([counter], dtype=np.uint32), key)
    assert tuple(int(w) for w in out[0]) == expected


@native
@pytest.mark.parametrize(("counter", "key", "expected"), PHILOX_KNOWN_ANSWERS)
def test_native_philox_reproduces_random123_known_answers(counter, key, expected):
    assert gk.native_philox(gk._kernel(), counter, key) == expected


def test_the_kernel_is_used_where_it_can_be():
    """On x86-64 Linux with AVX2 and a C compiler (this CI machine) a silent fall-back would
    quietly lose the speed: it must load, and its OpenMP calls must go to the runtime torch's
    own kernels use (one thread pool, not two competing for the cores; scikit-learn's
    vendored libgomp may be loaded too and must not be the one)."""
    if not SUPPORTED_HERE:
        pytest.skip("not an AVX2 Linux machine with a C compiler")
    status = native_status()
    assert status.available, status.reason
    libtorch = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    ours = gk._symbol_file(gk._kernel(), "GOMP_parallel")
    assert ours is not None and ours == gk._symbol_file(libtorch, "GOMP_parallel")


WIDTHS = [pytest.param(0, id="avx2"), pytest.param(1, id="avx512", marks=pytest.mark.skipif(
    not gk._wide(), reason="torch does not report AVX-512 here"))]


@native
@pytest.mark.parametrize("wide", WIDTHS)
@pytest.mark.parametrize("n", [1, 7, 63, 64, 65, 1000, 8192, 8193, 100_003])
def test_native_stream_matches_the_reference(n, wide):
    words = (0x9E3779B9, 17, 0xFFFFFFFF, 2**31 + 5)
    out = torch.empty(n)
    gk._kernel().raydp_philox_gaussian(out.data_ptr(), n, *words, 0.75, 2, wide)
    np.testing.assert_allclose(out.numpy(), reference_gaussian(n, words, 0.75),
                               rtol=0, atol=REFERENCE_TOLERANCE * 0.75)


@native
def test_both_vector_widths_give_the_same_stream():
    if not gk._wide():
        pytest.skip("torch does not report AVX-512 here")
    words = (1, 2, 3, 4)
    a, b = torch.empty(10_000), torch.empty(10_000)
    gk._kernel().raydp_philox_gaussian(a.data_ptr(), 10_000, *words, 1.0, 1, 0)
    gk._kernel().raydp_philox_gaussian(b.data_ptr(), 10_000, *words, 1.0, 1, 1)
    torch.testing.assert_close(a, b, rtol=0, atol=2 * REFERENCE_TOLERANCE)


@native
def test_native_stream_does_not_depend_on_the_thread_count():
    n = 50_021  # > 128 groups: the parallel loop runs
    outs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(gaussian_(torch.empty(n), 1.0, torch.Generator().manual_seed(4)))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_the_noise_law_is_standard_normal():
    """2·10⁶ values (the native stream here, normal_ where it does not apply): mean, variance,
    kurtosis and tail mass at the tolerances of their standard errors (~4.5 s.e.), a KS test,
    and the 24-bit Box–Muller bound |z| ≤ 5.77."""
    z = gaussian_(torch.empty(2_000_000), 1.0, secret_generator("cpu", 2024)).double().numpy()
    n = z.size
    assert abs(z.mean()) < 4.5 / np.sqrt(n)
    assert abs(z.var() - 1) < 4.5 * np.sqrt(2 / n)
    assert abs(np.mean(z**4) - 3) < 4.5 * np.sqrt(96 / n)
    beyond3 = np.mean(np.abs(z) > 3)
    p3 = 2 * stats.norm.sf(3)
    assert abs(beyond3 - p3) < 4.5 * np.sqrt(p3 / n)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert np.abs(z).max() <= np.sqrt(2 * np.log(2.0**24)) + 1e-5


def test_consecutive_draws_and_neighbouring_values_are_uncorrelated():
    gen = secret_generator("cpu", 7)
    a = gaussian_(torch.empty(400_000), 1.0, gen).double().numpy()
    b = gaussian_(torch.empty(400_000), 1.0, gen).double().numpy()
    bound = 4.5 / np.sqrt(a.size)
    assert abs(np.corrcoef(a, b)[0, 1]) < bound  # two releases: fresh keys
    for lag in (1, 16, 32, 64):  # the blocks, halves, pairs and groups of the layout
        assert abs(np.corrcoef(a[:-lag], a[lag:])[0, 1]) < bound
    # the (cos, sin) halves of one Box–Muller pair are uncorrelated, and so are their squares
    pairs = a.reshape(-1, 2, 2, 16)
    cos_half, sin_half = pairs[:, :, 0].ravel(), pairs[:, :, 1].ravel()
    assert abs(np.corrcoef(cos_half, sin_half)[0, 1]) < 4.5 / np.sqrt(cos_half.size)
    assert abs(np.corrcoef(cos_half**2, sin_half**2)[0, 1]) < 4.5 / np.sqrt(cos_half.size)


def test_the_values_are_a_function_of_the_generator_state_only():
    """The only secret is the generator's: the same state gives the same noise, the global
    torch RNG plays no part, each draw takes exactly the four key words from the generator,
    and the stream is the reference's for those words."""
    gen = secret_generator("cpu", 11, 3)
    twin = torch.Generator()
    twin.set_state(gen.get_state())
    torch.manual_seed(0)
    first = gaussian_(torch.empty(5000), 0.3, gen)
    torch.manual_seed(12345)
    again = gaussian_(torch.empty(5000), 0.3, twin)
    assert torch.equal(first, again)
    assert torch.equal(gen.get_state(), twin.get_state())
    if native_status().available:
        replay = torch.Generator()
        replay.set_state(secret_generator("cpu", 11, 3).get_state())
        words = draw_key(replay)
        assert torch.equal(replay.get_state(), twin.get_state())  # four words, no more
        np.testing.assert_allclose(first.numpy(), reference_gaussian(5000, words, 0.3),
                                   rtol=0, atol=REFERENCE_TOLERANCE * 0.3)
    other = gaussian_(torch.empty(5000), 0.3, secret_generator("cpu", 11, 4))
    assert not torch.equal(first, other)


@pytest.mark.parametrize("case", ["float64", "strided", "empty"])
def test_falls_back_to_normal_where_the_kernel_does_not_apply(case):
    def make() -> torch.Tensor:
        if case == "float64":
            return torch.empty(1000, dtype=torch.float64)
        if case == "strided":
            return torch.empty(1000, 2)[:, 0]
        return torch.empty(0)

    out = make()
    expected = make().normal_(0.0, 2.0, generator=torch.Generator().manual_seed(9))
    got = gaussian_(out, 2.0, torch.Generator().manual_seed(9))
    assert got is out
    assert torch.equal(got, expected)


def test_disabled_by_the_environment_falls_back_without_a_warning(tmp_path):
    code = (
        "import warnings, torch\n"
        "warnings.simplefilter('error')\n"
        "from raydp_hpo.trainables.gaussian_kernel import gaussian_, native_status\n"
        "out = gaussian_(torch.empty(100), 1.0, torch.Generator().manual_seed(1))\n"
        "ref = torch.empty(100).normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))\n"
        "s = native_status()\n"
        "assert not s.available and 'disabled' in s.reason, s\n"
        "assert torch.equal(out, ref)\n"
    )
    env = {**os.environ, gk.DISABLE_ENV: "0", gk.CACHE_ENV: str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_build_failure_is_reported_and_falls_back(tmp_path):
    """A compiler that fails: a RuntimeWarning that names the reason, and normal_'s values."""
    code = (
        "import warnings, torch\n"
        "from raydp_hpo.trainables.gaussian_kernel import gaussian_, native_status\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    out = gaussian_(torch.empty(100), 1.0, torch.Generator().manual_seed(1))\n"
        "ref = torch.empty(100).normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))\n"
        "assert torch.equal(out, ref)\n"
        "s = native_status()\n"
        "assert not s.available, s\n"
        "assert any('native Gaussian kernel is not used' in str(w.message) for w in seen), seen\n"
    )
    env = {**os.environ, "CC": "false", gk.CACHE_ENV: str(tmp_path)}
    env.pop(gk.DISABLE_ENV, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_an_unwritable_cache_builds_into_a_private_directory(tmp_path):
    """A cache directory that cannot be created (a read-only home on a cluster node; here a
    path under a regular file, which fails for root too) must not cost the kernel: it is
    built into a fresh mkdtemp directory of this process (mode 0700) instead."""
    if not SUPPORTED_HERE:
        pytest.skip("not an AVX2 Linux machine with a C compiler")
    code = (
        "import torch\n"
        "from raydp_hpo.trainables.gaussian_kernel import gaussian_, native_status\n"
        "gaussian_(torch.empty(100), 1.0, torch.Generator().manual_seed(1))\n"
        "s = native_status()\n"
        "assert s.available, s\n"
        "print(s.library)\n"
    )
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    env = {**os.environ, gk.CACHE_ENV: str(blocker / "cache")}
    env.pop(gk.DISABLE_ENV, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    library = Path(done.stdout.strip().splitlines()[-1])
    assert library.exists() and not str(library).startswith(str(tmp_path))
    assert library.parent.stat().st_mode & 0o777 == 0o700
    library.unlink()
    library.parent.rmdir()

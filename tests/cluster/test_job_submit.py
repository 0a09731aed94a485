"""(a) A real local Ray cluster on loopback: ``ray start --head`` with the dashboard, then
``ray job submit --working-dir .`` of the example experiment through cluster/entrypoint.py,
and ``ray job submit --working-dir examples`` of examples/ray_job_tuning.py (issue 29).

Marked ``slow`` and ``cluster`` (``make test-cluster``). Stops only the processes of the
cluster it started (by PID, found through its own temp dir and GCS port); never ``ray stop``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster._procs import stop_cluster

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "cluster/examples/mnist1d_small.yaml"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # the job's `python` must be the interpreter that has the dependencies
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.pop("RAY_ADDRESS", None)
    return env


def _free_port_block(size: int) -> int:
    """The first port of ``size`` consecutive ports that are free now, drawn between Ray's
    worker ports (10002 to 19999 by default, which ``ray start`` refuses to share) and the
    kernel's ephemeral range.

    Each is checked by binding it on every interface, and all stay bound until the last is
    checked. Asking the kernel for port 0 instead draws from the ephemeral range, where the
    many sockets the cluster's own processes open on port 0 can take a chosen port before Ray
    binds it (CI once saw the runtime-env agent's requests answered by the metrics exporter).
    """
    low, _ = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    draw = random.Random()
    while True:
        base = draw.randrange(20_000, max(low, 25_000) - size)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + size):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()


def _readme_head_command(base: int, temp_dir: str) -> str:
    """The local-head recipe of cluster/README.md as written (``P=...`` and its ``ray start``
    command), with the port block and temp dir of this test: what the README tells a user to
    run is what starts this cluster."""
    text = (ROOT / "cluster" / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^P=\d+\n(ray start (?:.*\\\n)*.*)$", text, flags=re.M)
    assert match, "cluster/README.md lost its local-head recipe (P=... then ray start ...)"
    command = match.group(1).replace("--temp-dir=/tmp/raydp-head", f"--temp-dir={temp_dir}")
    return f"P={base}\n{command}"


def _job_succeeded(proc: subprocess.CompletedProcess[str]) -> bool:
    """Whether ``ray job submit`` reported its job as succeeded: the CLI's closing line
    ``Job 'raysubmit_…' succeeded``, looked for in everything it printed.

    Not in a fixed-length tail of ``stdout + stderr``: Ray logs one line per git-ignored file
    it leaves out of the working-dir package (caches that lint, mypy, hypothesis leave behind),
    so how much text follows the status line depends on what ran before (CI once failed here
    with the job succeeded and the line pushed out of the last 4,000 characters).
    """
    text = proc.stdout + proc.stderr
    return re.search(r"Job '[^']+' succeeded", text) is not None


@dataclass(frozen=True)
class Head:
    """A running ``ray start --head`` of this module: its job-server address and environment."""

    address: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def ray_head() -> Iterator[Head]:
    """One real head node started by cluster/README.md's recipe on a free port block, shared
    by this module's tests; stops only its own processes (its temp dir, its GCS port)."""
    ray_bin = str(Path(sys.executable).parent / "ray")
    temp_dir = tempfile.mkdtemp(prefix="rdhjob", dir="/tmp")  # short: socket paths
    base = _free_port_block(9)  # the README pins P..P+8
    env = _env()
    try:
        head = subprocess.run(
            ["bash", "-c", _readme_head_command(base, temp_dir)],
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert head.returncode == 0, (head.stdout + head.stderr)[-3000:]
        address = f"http://127.0.0.1:{base + 1}"
        for _ in range(60):  # the job server comes up shortly after the dashboard
            probe = subprocess.run([ray_bin, "job", "list", "--address", address], env=env,
                                   capture_output=True, text=True, timeout=60)
            if probe.returncode == 0:
                break
            time.sleep(1)
        yield Head(address, env)
    finally:
        stop_cluster(temp_dir, f":{base}")
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_runs_the_example_within_budget(ray_head: Head, tmp_path: Path) -> None:
    ray_bin = str(Path(sys.executable).parent / "ray")
    storage = tmp_path / "results"
    start = time.monotonic()
    proc = subprocess.run(
        [ray_bin, "job", "submit", "--address", ray_head.address, "--working-dir", ".",
         "--runtime-env", "cluster/runtime_env.yaml", "--",
         "python", "cluster/entrypoint.py", EXAMPLE, "--storage-path", str(storage),
         "--progress-interval", "3"],
        cwd=ROOT, env=ray_head.env, capture_output=True, text=True, timeout=400,
    )
    elapsed = time.monotonic() - start
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert _job_succeeded(proc), tail
    assert "Privacy certificate" in proc.stdout, tail
    run_dir = storage / "mnist1d-small"
    cert = json.loads((run_dir / "public" / "certificate.json").read_text())
    release = json.loads((run_dir / "public" / "release.json").read_text())
    assert cert["epsilon"]["best"] <= cert["budget"]["epsilon"]
    assert release["certificate"] == cert
    assert release["hyperparameters"] is not None
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    print(f"job finished in {elapsed:.1f}s, ε={cert['epsilon']['best']:.4f}")


def test_ray_job_submit_of_example_4_keeps_its_storage(ray_head: Head, tmp_path: Path) -> None:
    """examples/ray_job_tuning.py submitted as its docstring says (``--working-dir examples``):
    the job succeeds, prints its certificate, and its release and both ledgers (the
    experiment's and the dataset's) are on the storage path after the job has ended."""
    ray_bin = str(Path(sys.executable).parent / "ray")
    storage = tmp_path / "durable"
    proc = subprocess.run(
        [ray_bin, "job", "submit", "--address", ray_head.address, "--working-dir", "examples",
         "--", "python", "ray_job_tuning.py", "--smoke", "--storage", str(storage)],
        cwd=ROOT, env=ray_head.env, capture_output=True, text=True, timeout=500,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert _job_succeeded(proc), out[-4000:]
    assert "Privacy certificate" in proc.stdout, out[-4000:]
    # the job's own working directory is gone; what it printed points into the storage
    match = re.search(r"^publishable release: (.+)$", proc.stdout, flags=re.M)
    assert match, out[-4000:]
    public = Path(match.group(1).strip())
    assert public.parent.parent == storage, public
    cert = json.loads((public / "certificate.json").read_text())
    release = json.loads((public / "release.json").read_text())
    assert release["certificate"] == cert
    assert release["hyperparameters"] is not None
    assert (public / "released_model.pt").is_file()
    assert cert["epsilon"]["best"] <= cert["budget"]["epsilon"]
    # the certificate the job logged is the one on disk
    printed = re.search(r"ε \(tightest\)\s+([0-9.]+)\s+certified", proc.stdout)
    assert printed, out[-4000:]
    assert float(printed.group(1)) == pytest.approx(cert["epsilon"]["best"], abs=5e-5)
    # the ledgers outlive the job: the experiment's journal and the dataset's, with its charge
    assert (public.parent / "ledger.journal").stat().st_size > 0
    journals = list((storage / "ledgers").glob("*.journal"))
    assert len(journals) == 1 and journals[0].stat().st_size > 0, journals

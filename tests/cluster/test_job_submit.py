"""(a) A real local Ray cluster on loopback: ``ray start --head`` with the dashboard, then
``ray job submit --working-dir .`` of the example experiment through cluster/entrypoint.py.

Marked ``slow`` and ``cluster`` (``make test-cluster``). Stops only the processes of the
cluster it started (by PID, found through its own temp dir and GCS port); never ``ray stop``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.cluster._procs import stop_cluster

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "cluster/examples/mnist1d_small.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # the job's `python` must be the interpreter that has the dependencies
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.pop("RAY_ADDRESS", None)
    return env


def test_ray_job_submit_runs_the_example_within_budget(tmp_path: Path) -> None:
    ray_bin = str(Path(sys.executable).parent / "ray")
    temp_dir = tempfile.mkdtemp(prefix="rdhjob", dir="/tmp")  # short: socket paths
    gcs, dash = _free_port(), _free_port()
    ports = [f"--{name}={_free_port()}" for name in (
        "ray-client-server-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
        "metrics-export-port", "runtime-env-agent-port", "node-manager-port",
        "object-manager-port")]
    env = _env()
    storage = tmp_path / "results"
    try:
        subprocess.run(
            [ray_bin, "start", "--head", f"--port={gcs}", f"--temp-dir={temp_dir}",
             "--node-ip-address=127.0.0.1", "--include-dashboard=true",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--num-cpus=2",
             "--disable-usage-stats", *ports],
            env=env, check=True, capture_output=True, text=True, timeout=120,
        )
        address = f"http://127.0.0.1:{dash}"
        for _ in range(60):  # the job server comes up shortly after the dashboard
            probe = subprocess.run([ray_bin, "job", "list", "--address", address], env=env,
                                   capture_output=True, text=True, timeout=60)
            if probe.returncode == 0:
                break
            time.sleep(1)
        start = time.monotonic()
        proc = subprocess.run(
            [ray_bin, "job", "submit", "--address", address, "--working-dir", ".",
             "--runtime-env", "cluster/runtime_env.yaml", "--",
             "python", "cluster/entrypoint.py", EXAMPLE, "--storage-path", str(storage),
             "--progress-interval", "3"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
        )
        elapsed = time.monotonic() - start
        tail = (proc.stdout + proc.stderr)[-4000:]
        assert proc.returncode == 0, tail
        assert "succeeded" in tail.lower(), tail
        assert "Privacy certificate" in proc.stdout, tail
        run_dir = storage / "mnist1d-small"
        cert = json.loads((run_dir / "certificate.json").read_text())
        release = json.loads((run_dir / "release.json").read_text())
        assert cert["epsilon"]["best"] <= cert["budget"]["epsilon"]
        assert release["certificate"] == cert
        assert release["hyperparameters"] is not None
        assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
        print(f"job finished in {elapsed:.1f}s, ε={cert['epsilon']['best']:.4f}")
    finally:
        stop_cluster(temp_dir, f":{gcs}")
        shutil.rmtree(temp_dir, ignore_errors=True)

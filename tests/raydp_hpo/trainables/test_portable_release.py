"""A released model loads in a fresh Python process that never imported the training script
(issue #37): a user model's exported program beside its state dict, the built-in models from
raydp-hpo's own zoo, and a warning at save_model for a model the exporter cannot trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import raydp_hpo
from raydp_hpo.trainables.models import MODEL_NAMES, build_model
from raydp_hpo.trainables.release import (
    USER_MODEL_FILE,
    load_released_model,
    program_path,
    save_released_model,
)
from tests.raydp_hpo.trainables.test_session import TRAIN, _config, _ledger

ROOT = Path(__file__).resolve().parents[3]

#: a training script whose model class lives in the script itself (``__main__:MLP``)
SCRIPT = textwrap.dedent('''
    import json, sys
    import torch
    from torch import nn
    from torch.utils.data import DataLoader
    import raydp_hpo
    from tests.raydp_hpo.trainables.test_session import TRAIN, VAL, _config, _ledger

    class MLP(nn.Module):
        def __init__(self, width=8):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 2))

        def forward(self, x):
            return self.net(x)

    released = {}
    for engine in (raydp_hpo.DPEngine.OPACUS, raydp_hpo.DPEngine.NATIVE):
        with raydp_hpo.trial_session(_config(), ledger=_ledger(), secret_seed=0) as trial:
            model = MLP(8)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
            model, optimizer, loader = trial.make_private(model, optimizer, TRAIN,
                                                          engine=engine)
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
            path = trial.save_model(model, model_kwargs={"width": 8})
            trial.report_score(trial.count_correct(model, DataLoader(VAL, batch_size=25)))
            target = sys.argv[1] + "/" + engine.value + ".pt"
            for suffix in (".pt", ".pt2"):  # the trial's folder is removed at its end
                open(target[:-3] + suffix, "wb").write(open(str(path)[:-3] + suffix, "rb").read())
            with torch.no_grad():
                out = model(VAL.tensors[0][:5]).tolist()
        released[engine.value] = {"path": target, "model_fn": torch.load(path)["model_fn"],
                                  "out": out}
    json.dump(released, open(sys.argv[1] + "/out.json", "w"))
''')

#: a fresh process: imports raydp_hpo only, loads and runs each model
LOAD = textwrap.dedent('''
    import json, sys
    import torch
    import raydp_hpo
    out = {}
    for name, (path, x) in json.loads(sys.argv[1]).items():
        with torch.no_grad():
            out[name] = raydp_hpo.load_released_model(path)(torch.tensor(x)).tolist()
    print("OUT " + json.dumps(out))
    print("MAIN " + json.dumps([k for k in vars(sys.modules["__main__"]) if k == "MLP"]))
''')


def _python(code: str, *args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def _built_in_models(tmp_path: Path) -> dict[str, tuple[str, list, list]]:
    """Each built-in model saved by save_released_model: ``name -> (path, input, output)``."""
    jobs = {}
    for name in MODEL_NAMES:
        shape: tuple[int, ...] = (1, 8, 8) if name in ("cnn", "resnet") else (16,)
        try:
            model = build_model(name, shape, 3).eval()
        except Exception:  # a model that needs other shapes: one it accepts
            shape = (1, 28, 28)
            model = build_model(name, shape, 3).eval()
        x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            y = model(x).tolist()
        path = save_released_model(tmp_path / f"{name}.pt", model, model_name=name,
                                   model_kwargs={}, feature_shape=shape, num_classes=3)
        jobs[name] = (str(path), x.tolist(), y)
    return jobs


def test_released_models_load_in_a_fresh_process(tmp_path: Path) -> None:
    """A model class of the training script (``model_fn='__main__:MLP'``), trained on each
    engine, loads from its exported program in a process that has no ``MLP`` and computes what
    the trained model computed; so does every built-in model (rebuilt from raydp-hpo's zoo).
    Two subprocesses: the training script, and one loader for all."""
    from tests.raydp_hpo.trainables.test_session import VAL

    script = tmp_path / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    trained = json.loads((tmp_path / "out.json").read_text())
    x = VAL.tensors[0][:5].tolist()
    jobs = {name: (t["path"], x, t["out"]) for name, t in trained.items()}
    assert {t["model_fn"] for t in trained.values()} == {"__main__:MLP"}
    assert all(program_path(t["path"]).is_file() for t in trained.values())
    jobs.update(_built_in_models(tmp_path))
    out = _python(LOAD, json.dumps({k: v[:2] for k, v in jobs.items()}), cwd=tmp_path)
    loaded = json.loads(next(line for line in out.splitlines() if line.startswith("OUT "))[4:])
    for name, (_, _, expected) in jobs.items():
        assert torch.allclose(torch.tensor(loaded[name]), torch.tensor(expected),
                              atol=1e-5), name
    assert "MAIN []" in out  # the loading process never defined MLP


class Branchy(nn.Module):
    """Data-dependent control flow: torch.export cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        if float(out.sum()) > 0:
            return out
        return -out


def test_a_model_that_cannot_be_exported_warns_at_save_model() -> None:
    with raydp_hpo.trial_session(_config(), ledger=_ledger(), secret_seed=0) as trial:
        model = Branchy()
        model, optimizer, loader = trial.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.5), TRAIN)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        with pytest.warns(UserWarning, match=r"Branchy cannot be exported with torch.export "
                                             r"\(.*\); the release holds its state_dict only"):
            path = trial.save_model(model)
        trial.report_score(10)
    assert path.name == USER_MODEL_FILE and not program_path(path).is_file()
    assert isinstance(load_released_model(path), Branchy)  # the model_fn route still works

"""Issue #38 figures: named file ledger, one search each, digits, ε=3."""
import os, sys, tempfile, warnings
from pathlib import Path
sys.path.insert(0, os.getcwd() + "/benchmarks")
import dataset_ledger as b
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.accounting.accountants import epsilon, Accountant
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ["PGUSER"] = "ledger_rw"
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
b.SEARCHES["random_stopping"] = {"settings": {"distribution": "geometric", "mean": 2}}
mode = sys.argv[1]
srv = None
if mode == "pg":
    sys.path.insert(0, os.getcwd())
    from tests.raydp_hpo.ledger.pg_server import start_server
    os.environ["PGUSER"] = "ledger_rw"
for alg in ("one_shot_random", "random_stopping"):
    with tempfile.TemporaryDirectory(prefix="rdh-tight-", dir=Path.home()) as tmp:
        raw = b.experiment("digits", alg, Path(tmp), f"{alg}-1")
        if mode == "named":
            raw["ledger"] = {"name": f"org-{alg.replace('_','-')}"}
        if mode == "pg":
            if srv is not None:
                srv.cleanup()
            srv, why = start_server()  # a database of its own: the registry binds digits once
            name = f"org-{alg.replace('_','-')}"
            raw["ledger"] = {"name": name, "uri": srv.uri(name)}
        out = b.run(raw)
        cert = out.result.certificate
        rep = PrivacyLedger.read_only(out.journal).report()
        point = rep.charges[0].mechanism
        full = epsilon(point, 1e-5, Accountant.TIGHTEST)
        print(f"| {mode} | {alg} | rule {rep.adaptivity.value} | certified {cert.epsilon:.4f} (δ={cert.budget.delta:.3g}) | recorded {rep.spent_epsilon:.4f} | ratio {cert.epsilon/rep.spent_epsilon:.4f} | tight at full δ {full:.4f} | full/certified {full/cert.epsilon:.4f} |", flush=True)
        try:
            ray.kill(ray.get_actor(b.parse_experiment(raw).ledger_name, namespace="raydp_hpo")) if hasattr(b,'parse_experiment') else None
        except Exception: pass
        b.stop_ledger(raw)
ray.shutdown()
if srv is not None:
    srv.cleanup()

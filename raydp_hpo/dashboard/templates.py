"""The dashboard's HTML pages (Jinja2 templates, autoescaped; kept in code so the package needs
no data files). Plotly is served from the installed ``plotly`` package (``/static/plotly.min.js``):
no CDN, the pages work offline."""

from __future__ import annotations

BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{% block title %}{% endblock %} · raydp-hpo dashboard</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{background:#1d2b45;color:#fff;padding:.6rem 1.5rem;display:flex;gap:1.5rem;align-items:baseline}
header a{color:#fff;text-decoration:none;font-weight:600}
header .ro{font-size:.8rem;opacity:.8}
main{padding:1rem 1.5rem;max-width:1400px}
h1{font-size:1.35rem;margin:.4rem 0 1rem} h2{font-size:1.1rem;margin:1.4rem 0 .5rem}
table{border-collapse:collapse;background:#fff;width:100%;font-size:.88rem}
#hyperparameters th{width:14rem}
th,td{border-bottom:1px solid #e1e4ea;padding:.35rem .55rem;text-align:left;vertical-align:top}
th{background:#eef1f6;white-space:nowrap} th a{color:inherit}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#0b6b2f;font-weight:600} .checking{color:#8a6d00;font-weight:600} .CORRUPTED,.unreadable{color:#b00020;font-weight:700}
.problems{color:#b00020;font-size:.8rem;margin:.2rem 0 0 1rem;padding:0}
meter{width:8rem;height:1rem}
.card{background:#fff;border:1px solid #e1e4ea;border-radius:6px;padding:.8rem 1rem;margin:.6rem 0}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:.25rem 1rem;margin:0}
dl.kv dt{font-weight:600;color:#4a5568}
.muted{color:#6b7280;font-size:.85rem} td .muted{font-size:.75rem} .private{color:#8a4b00}
pre{background:#f0f2f5;padding:.6rem;overflow:auto;font-size:.8rem}
.pager a,.pager span{margin-right:.8rem}
form.filter{margin:.3rem 0 .8rem}
</style></head>
<body><header><a href="{{ url('/') }}">raydp-hpo · privacy budgets</a>
<span class="ro">read-only view of {{ n_locations }} location(s)</span></header>
<main>{% block main %}{% endblock %}</main>
{% block scripts %}{% endblock %}
</body></html>
"""

LEDGERS = """{% extends "base.html" %}
{% block title %}Ledgers{% endblock %}
{% block main %}
<h1>Ledgers</h1>
{% for e in errors %}<p class="CORRUPTED">cannot list {{ e }}</p>{% endfor %}
<form class="filter" method="get" action="{{ url('/') }}">
<input type="search" name="q" id="filter" value="{{ q }}" placeholder="filter: ledger, dataset, rule, status">
<input type="hidden" name="sort" value="{{ sort }}"><input type="hidden" name="order" value="{{ order }}">
<button type="submit">Filter</button>
<span class="muted">{{ rows|length }} ledger(s)</span></form>
<table id="ledgers">
<thead><tr>
{% for key, label, cls in columns %}
<th class="{{ cls }}"><a href="{{ url('/', sort=key, order=('desc' if sort == key and order == 'asc' else 'asc'), q=q) }}">{{ label }}{% if sort == key %} {{ '▲' if order == 'asc' else '▼' }}{% endif %}</a></th>
{% endfor %}
</tr></thead>
<tbody>
{% for r in rows %}
<tr data-ledger-id="{{ r.source.id }}">
<td><a class="ledger-link" href="{{ url('/ledgers/' ~ r.source.id) }}">{{ r.source.shown }}</a></td>
<td>{{ r.source.binding or '—' }}</td>
<td class="num budget">{% if r.budget_epsilon is not none %}ε={{ '%g'|format(r.budget_epsilon) }}, δ={{ '%g'|format(r.budget_delta) }}{% else %}—{% endif %}</td>
<td class="num spent">{% if r.spent_epsilon is not none %}{{ '%.4f'|format(r.spent_epsilon) }}{% else %}—{% endif %}</td>
<td class="num remaining">{% if r.remaining_epsilon is not none %}<meter min="0" max="1" low="0.2" optimum="1" value="{{ 1 - r.used_fraction }}" title="{{ '%.0f'|format(100 * (1 - r.used_fraction)) }}% left"></meter> {{ '%.4f'|format(r.remaining_epsilon) }}{% else %}—{% endif %}</td>
<td>{{ r.halting_rule or '—' }}</td>
<td class="num charges">{{ r.charges }}</td>
<td>{{ fmt_time(r.last_charge) }}</td>
<td class="integrity"><span class="{{ r.integrity.value }}">{{ r.integrity.value }}</span>
<div class="muted">chain: {{ r.chain or '—' }}; seal/head: {{ r.seal or '—' }}{% if r.curves %}; curves: {{ r.curves }}{% endif %}</div>
{% if r.problems %}<ul class="problems">{% for p in r.problems %}<li>{{ p }}</li>{% endfor %}</ul>{% endif %}
</td></tr>
{% else %}<tr><td colspan="9">no ledgers found under the given locations</td></tr>
{% endfor %}
</tbody></table>
{% if experiments %}
<h2>Experiments</h2>
<ul id="experiments">{% for e in experiments %}<li><a class="experiment-link" href="{{ url('/experiments/' ~ e.id) }}">{{ e.shown }}</a></li>{% endfor %}</ul>
{% endif %}
<p class="muted">Figures as <code>raydp-hpo ledger show</code> gives them (ε spent under each ledger's halting rule, at its δ); integrity as <code>raydp-hpo ledger verify</code> checks it. JSON: <a href="{{ url('/api/ledgers') }}">/api/ledgers</a>.</p>
{% endblock %}
"""

LEDGER = """{% extends "base.html" %}
{% block title %}{{ s.source.shown }}{% endblock %}
{% block main %}
<h1>Ledger <span id="ledger-name">{{ s.source.shown }}</span></h1>
<div class="card"><dl class="kv" id="ledger-summary">
<dt>binding</dt><dd>{{ s.source.binding or '—' }}</dd>
<dt>integrity</dt><dd><span class="{{ s.integrity.value }}" id="integrity">{{ s.integrity.value }}</span>
 <span class="muted">chain: {{ s.chain or '—' }}; seal/head: {{ s.seal or '—' }}{% if s.curves %}; curves: {{ s.curves }}{% endif %}</span>
{% if s.problems %}<ul class="problems">{% for p in s.problems %}<li>{{ p }}</li>{% endfor %}</ul>{% endif %}</dd>
{% if s.budget_epsilon is not none %}
<dt>budget</dt><dd id="budget">ε={{ '%g'|format(s.budget_epsilon) }}, δ={{ '%g'|format(s.budget_delta) }}</dd>
<dt>halting rule</dt><dd id="rule">{{ s.halting_rule }}</dd>
<dt>spent</dt><dd id="spent">ε={{ '%.4f'|format(s.spent_epsilon) }}</dd>
<dt>remaining</dt><dd><meter min="0" max="1" low="0.2" optimum="1" value="{{ 1 - s.used_fraction }}"></meter> <span id="remaining">ε={{ '%.4f'|format(s.remaining_epsilon) }}</span></dd>
<dt>charges</dt><dd id="charge-count">{{ s.charges }}</dd>
<dt>releases</dt><dd id="release-count">{{ s.releases }} <span class="muted">run(s) published (one release per run; charges nothing)</span></dd>
<dt>last charge</dt><dd>{{ fmt_time(s.last_charge) }}</dd>
{% endif %}
</dl></div>
{% if s.charges %}
<h2>Spend over time</h2>
<div id="spend-plot" style="height:340px" class="card"></div>
<script type="application/json" id="spend-data">{{ plot_json|safe }}</script>
<h2>Experiments that charged it</h2>
<table id="ledger-experiments"><thead><tr><th>experiment (owner)</th><th class="num">charges</th><th class="num">ε after its last charge</th><th>last charge</th></tr></thead><tbody>
{% for o in owners %}<tr><td>{% if o.links %}{% for e in o.links %}<a class="experiment-link" href="{{ url('/experiments/' ~ e.id) }}">{{ o.owner }}</a>{% if o.links|length > 1 %} <span class="muted">({{ e.shown }})</span>{% endif %} {% endfor %}{% else %}{{ o.owner or '—' }} <span class="muted">(no released experiment found under the given locations)</span>{% endif %}</td>
<td class="num">{{ o.count }}</td><td class="num">{{ '%.4f'|format(o.epsilon_after) }}</td><td>{{ fmt_time(o.last) }}</td></tr>{% endfor %}
</tbody></table>
<h2>Charges</h2>
<p class="pager" id="pager">{% if page > 1 %}<a href="{{ url('/ledgers/' ~ s.source.id, page=1) }}">« newest</a><a id="prev" href="{{ url('/ledgers/' ~ s.source.id, page=page - 1) }}">‹ newer</a>{% endif %}
<span>page {{ page }} of {{ pages }} (charges {{ first }}–{{ last }} of {{ s.charges }}, newest first)</span>
{% if page < pages %}<a id="next" href="{{ url('/ledgers/' ~ s.source.id, page=page + 1) }}">older ›</a><a href="{{ url('/ledgers/' ~ s.source.id, page=pages) }}">oldest »</a>{% endif %}</p>
<table id="charges"><thead><tr><th class="num">#</th><th>time</th><th>experiment</th><th>charge</th><th>owner</th><th>mechanism</th><th class="num">ε after</th></tr></thead><tbody>
{% for c in rows %}<tr><td class="num">{{ c.seq }}</td><td>{{ fmt_time(c.time) }}</td>
<td>{% for e in links.get(c.owner, []) %}<a href="{{ url('/experiments/' ~ e.id) }}">{{ e.name }}</a> {% else %}—{% endfor %}</td>
<td>{{ c.charge_id }}</td><td>{{ c.owner or '—' }}</td><td>{{ c.mechanism }}</td><td class="num eps-after">{{ '%.4f'|format(c.epsilon_after) }}</td></tr>{% endfor %}
</tbody></table>
{% endif %}
<p class="muted">JSON: <a href="{{ url('/api/ledgers/' ~ s.source.id, page=page) }}">/api/ledgers/{{ s.source.id }}</a></p>
{% endblock %}
{% block scripts %}{% if s.charges %}
<script src="{{ url('/static/plotly.min.js') }}"></script>
<script src="{{ url('/static/plots.js') }}"></script>
{% endif %}{% endblock %}
"""

EXPERIMENT = """{% extends "base.html" %}
{% block title %}{{ x.name }}{% endblock %}
{% block main %}
<h1>Experiment <span id="experiment-name">{{ x.name }}</span></h1>
<p class="muted">{{ x.experiment }}</p>
<h2>Released hyperparameters</h2>
{% if x.hyperparameters %}<table id="hyperparameters"><tbody>
{% for k, v in x.hyperparameters.items() %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}
</tbody></table>
{% if x.dp_test_accuracy is mapping and x.dp_test_accuracy.value is number %}<p id="dp-accuracy">DP test accuracy of the released model: <strong>{{ '%.4f'|format(x.dp_test_accuracy.value) }}</strong> (Laplace noise, ε={{ x.dp_test_accuracy.epsilon }}; released and covered by the certificate)</p>{% endif %}
{% else %}<p>none released{% if x.budget_exhausted %} (the budget was exhausted before a selection){% endif %}</p>{% endif %}
<h2>Privacy certificate</h2>
{% set c = x.certificate %}
<div class="card" id="certificate"><dl class="kv">
<dt>algorithm</dt><dd>{{ c.algorithm }}</dd>
<dt>paper</dt><dd>{{ c.paper }}</dd>
<dt>accounting</dt><dd>{{ c.description }}</dd>
{% if c.budget %}<dt>budget</dt><dd id="cert-budget">ε={{ '%g'|format(c.budget.epsilon) }}, δ={{ '%g'|format(c.budget.delta) }}</dd>{% endif %}
{% if c.epsilon %}<dt>certified ε</dt><dd id="cert-epsilon"><strong>{{ '%.4f'|format(c.epsilon.certified) }}</strong> ({{ c.epsilon.certified_accountant }}){% if c.budget %}, ≤ budget: {{ c.epsilon.certified <= c.budget.epsilon }}{% endif %}</dd>
{% for k, v in c.epsilon.items() if k not in ('certified', 'certified_accountant') %}<dt>ε ({{ k }})</dt><dd>{{ '%.4f'|format(v) if v is number else v }} <span class="muted">reference</span></dd>{% endfor %}{% endif %}
{% if c.ledger %}<dt>ledger</dt><dd>{{ c.ledger.name }} ({{ c.ledger.halting_rule }}), spent ε={{ '%.4f'|format(c.ledger.spent_epsilon) }}</dd>{% endif %}
<dt>privacy unit</dt><dd>{{ c.privacy_unit }}</dd>
{% if c.charges %}<dt>charges</dt><dd>{{ c.charges|length }}<ul>{% for ch in c.charges %}<li>{{ ch.charge_id }}: {{ ch.mechanism.type }}</li>{% endfor %}</ul></dd>{% endif %}
{% if c.treated_as_public %}<dt>treated as public</dt><dd><ul>{% for k, v in c.treated_as_public.items() %}<li>{{ k }}: {{ v }}</li>{% endfor %}</ul></dd>{% endif %}
{% for k, v in extra.items() %}<dt>{{ k }}</dt><dd><pre>{{ v }}</pre></dd>{% endfor %}
</dl>
<details><summary>certificate.json as released</summary><pre id="certificate-json">{{ cert_json }}</pre></details></div>
<h2>Accuracy vs ε</h2>
{% if x.accuracy_vs_epsilon %}<div id="accuracy-plot" style="height:300px" class="card"></div>
<script type="application/json" id="accuracy-data">{{ acc_json|safe }}</script>
{% else %}<p class="muted" id="no-accuracy">The run released no DP accuracy (per-trial scores before noise are private and are not shown).</p>{% endif %}
<h2>Public and private</h2>
<div class="card"><p><strong>Released</strong> (<code>public/</code>, covered by the certificate):</p>
<ul id="public-files">{% for f in x.public_files %}<li><a href="{{ url('/experiments/' ~ x.id ~ '/public/' ~ f) }}">{{ f }}</a></li>{% else %}<li>nothing</li>{% endfor %}</ul>
<p class="private"><strong>Private</strong> (not covered by the certificate; never shown here):</p>
<ul id="private-files">{% for p in x.private_artefacts %}<li class="private">{{ p.name }}: {{ p.what }}</li>{% else %}<li>none found</li>{% endfor %}</ul></div>
<p class="muted">JSON: <a href="{{ url('/api/experiments/' ~ x.id) }}">/api/experiments/{{ x.id }}</a></p>
{% endblock %}
{% block scripts %}{% if x.accuracy_vs_epsilon %}
<script src="{{ url('/static/plotly.min.js') }}"></script>
<script src="{{ url('/static/plots.js') }}"></script>
{% endif %}{% endblock %}
"""

ERROR = """{% extends "base.html" %}
{% block title %}{{ title }}{% endblock %}
{% block main %}<h1>{{ title }}</h1><p>{{ message }}</p><p><a href="{{ url('/') }}">all ledgers</a></p>{% endblock %}
"""

#: Draws the plots from the JSON blocks of a page (a file, not inline: the pages' CSP allows
#: scripts from the dashboard itself only).
PLOTS_JS = """(function () {
  function data(id) { var el = document.getElementById(id); return el ? JSON.parse(el.textContent) : null; }
  var cfg = {displaylogo: false, responsive: true};
  var s = data('spend-data');
  if (s) {
    var x = s.time.map(function (t) { return new Date(t * 1000).toISOString(); });
    Plotly.newPlot('spend-plot', [
      {x: x, y: s.epsilon_after, mode: 'lines+markers', line: {shape: 'hv'}, name: 'spent ε (halting rule)',
       text: s.charge_id, hovertemplate: '%{text}<br>ε after %{y:.4f}<extra></extra>'},
      {x: [x[0], x[x.length - 1]], y: [s.budget, s.budget], mode: 'lines', name: 'budget ε',
       line: {dash: 'dash', color: '#b00020'}}
    ], {margin: {t: 10, r: 10}, xaxis: {title: {text: 'time (UTC)'}}, yaxis: {title: {text: 'ε'}, rangemode: 'tozero'},
        legend: {orientation: 'h', x: 0, y: 1.12}}, cfg);
  }
  var a = data('accuracy-data');
  if (a) {
    Plotly.newPlot('accuracy-plot', [{x: a.map(function (p) { return p.epsilon; }),
      y: a.map(function (p) { return p.accuracy; }), mode: 'markers', marker: {size: 11},
      text: a.map(function (p) { return p.what; })}],
      {margin: {t: 10, r: 10}, xaxis: {title: {text: 'certified ε'}, rangemode: 'tozero'},
       yaxis: {title: {text: 'DP test accuracy'}}}, cfg);
  }
})();
"""

TEMPLATES = {
    "base.html": BASE,
    "ledgers.html": LEDGERS,
    "ledger.html": LEDGER,
    "experiment.html": EXPERIMENT,
    "error.html": ERROR,
}

"""Write notebooks/NN_<phase>.ipynb from the cell sources below (committed without outputs).

The notebooks are thin: a parameters cell holding references only, calls into runbook_lib, and
display. Edit the sources here and run ``python scripts/build_notebooks.py``; a test checks the
committed notebooks match this script.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

PARAMS = '''# Parameters: references only. The library loads and validates the YAML itself.
params_path = "../params/demo.yaml"  # migration params file
run_dir = ""  # run directory; empty: a new run (phase 01) or this migration's newest run
run_mode = "interactive"  # interactive | headless (the runner passes headless)
approval_ref = ""  # approval file for plans on providers that are not pre-approved'''

OPEN = '''from IPython.display import Markdown, display
import pandas as pd
from runbook_lib.phases import open_phase
from runbook_lib.report import gates_table

ctx = open_phase("{pid}", params_path, run_dir, run_mode=run_mode, approval_ref=approval_ref)
display(Markdown(f"**Run** `{{ctx.run_id}}` · migration `{{ctx.mig.migration}}` ({{ctx.mig.workload.kind}})  \\n"
                 f"**Source** {{ctx.mig.source.release}}  \\n**Target** {{ctx.mig.target.release}}"))'''

WIDGET = '''# Interactive only (tagged skip-execution: headless runs never wait on a click).
from runbook_lib.approvals import approval_widget
display(approval_widget({plan}, run_dir=ctx.run_dir))'''

FINISH = '''if ctx.gates:
    display(gates_table(ctx.gates))
record = ctx.finish({data})
display(Markdown(f"Record `{{record.path.name}}` · sha256 `{{record.sha256}}` · previous `{{record.body['prev_sha256'][:16]}}…`"))'''

NOTEBOOKS: dict[str, list[tuple[str, str, list[str]]]] = {
    "01_freeze_source": [
        ("md", "# 01 · Freeze source truth\n\nWhat exactly runs today, and what does it silently depend on? "
               "Evidence: host inventory, the source pod's environment, immutable identities, the frozen "
               "artifact with its manifest, golden outputs for fixed inputs, declared ports and needs, "
               "secret **names** (never values).", []),
        ("code", OPEN.format(pid="01"), []),
        ("md", "Launching the source pod is planned first; the plan is shown and applied only with an approval "
               "record.", []),
        ("code", "from runbook_lib.phases import freeze\n\n"
                 "plan = freeze.plan_freeze(ctx)\n"
                 "display(pd.DataFrame([plan.to_dict()]).drop(columns=[\"spec\"]))", []),
        ("code", WIDGET.format(plan="plan"), ["skip-execution"]),
        ("code", "host = freeze.host_inventory(ctx)\n"
                 "src = freeze.freeze_source(ctx)\n"
                 "if src.get(\"dry_run\"):\n"
                 "    display(Markdown(\"**Dry-run**: the freeze pod is planned above and recorded; nothing was launched.\"))\n"
                 "    display(pd.Series(src[\"source_pod\"] or {}, name=\"source pod (provider report)\", dtype=object).to_frame())\n"
                 "else:\n"
                 "    display(pd.DataFrame(freeze.inventory_rows(host, src[\"environment\"])))", []),
        ("code", "if not src.get(\"dry_run\"):\n"
                 "    display(Markdown(\"**Immutable identities**\"))\n"
                 "    display(pd.Series(src[\"identity\"], name=\"value\").to_frame())\n"
                 "    display(Markdown(f\"**Frozen artifact** `{src['frozen']['prefix']}` manifest sha256 "
                 "`{src['frozen']['manifest_sha256']}`\"))\n"
                 "    display(pd.DataFrame(src[\"frozen\"][\"objects\"]).T)\n"
                 "    display(Markdown(f\"**Golden outputs** shape {src['golden']['shape']} {src['golden']['dtype']}, "
                 "sha256 `{src['golden']['outputs_sha256']}`\"))", []),
        ("code", "requirements = freeze.requirements(ctx)\n"
                 "secrets = freeze.secrets_table(ctx)\n"
                 "findings = freeze.credential_findings(ctx, src.get(\"environment\"))\n"
                 "display(pd.Series(requirements, name=\"declared\").to_frame())\n"
                 "display(pd.DataFrame(secrets))\n"
                 "display(pd.DataFrame(findings, columns=[\"variable\", \"where\", \"declared\", \"finding\"]))", []),
        ("code", FINISH.format(data='{"host": host, "freeze": src, "requirements": requirements, "secrets": secrets, '
                                    '"credential_findings": findings, "dry_run": bool(src.get("dry_run"))}'), []),
    ],
    "02_map_target": [
        ("md", "# 02 · Map target equivalents\n\nWhat does each dependency become on the target, and what has no "
               "equivalent? Each row is `equivalent`, `adapter needed` (a known change later phases test) or "
               "`no equivalent` (blocks cutover).", []),
        ("code", OPEN.format(pid="02"), []),
        ("code", "from runbook_lib.phases import mapping\n\n"
                 "caps = ctx.provider(\"target\").capabilities()\n"
                 "offers = mapping.target_offers(ctx)  # remote target: search, re-check and rank offers\n"
                 "if offers is not None:\n"
                 "    display(Markdown(f\"**Offers**: {len(offers['ranked'])} of {len(offers['table'])} qualify; "
                 "ranked: {offers['ranked']}\"))\n"
                 "    display(pd.DataFrame(offers[\"table\"])[[\"offer_id\", \"gpu_name\", \"gpu_count\", "
                 "\"hourly_usd_with_disk\", \"region\", \"accepted\", \"reasons\", \"unverified\"]])\n"
                 "rows = mapping.dependency_map(ctx, offers)\n"
                 "ctx.write_json(\"02/dependency_map.json\", rows)\n"
                 "display(pd.DataFrame(rows))", []),
        ("code", "ctx.add_gates(mapping.dependency_gate(rows))\n"
                 + FINISH.format(data='{"dependency_map": rows, "target_capabilities": mapping.capabilities_dict(caps), '
                                     '"offers": offers}'), []),
    ],
    "03_prove_parity": [
        ("md", "# 03 · Prove artifact parity on a disposable canary\n\nDoes the same artifact and input give "
               "the same result on the target, and does it recover? The canary downloads the frozen artifact "
               "(re-hashing every byte), runs the acceptance job, is killed once after its first checkpoint and "
               "resumes, reloads its saved artifact, and is destroyed.", []),
        ("code", OPEN.format(pid="03"), []),
        ("code", "from runbook_lib.phases import parity\n\n"
                 "plan = parity.plan_canary(ctx)\n"
                 "display(pd.DataFrame([plan.to_dict()]).drop(columns=[\"spec\"]))\n"
                 "display(pd.Series(plan.spec.offers, name=\"ranked offers tried in order\", dtype=object).to_frame())", []),
        ("code", WIDGET.format(plan="plan"), ["skip-execution"]),
        ("code", "canary = parity.run_canary(ctx)\n"
                 "if canary.get(\"dry_run\"):\n"
                 "    display(Markdown(\"**Dry-run**: the canary launch is planned above and recorded; nothing was launched.\"))\n"
                 "else:\n"
                 "    display(pd.DataFrame(canary[\"capacity_tries\"], columns=[\"offer_id\", \"outcome\", \"detail\", \"resource_id\", \"at_s\"]))\n"
                 "    display(pd.DataFrame(canary[\"result\"].get(\"artifact_checksums\", [])))\n"
                 "    display(pd.Series(canary[\"result\"].get(\"failure_drill\") or {}, name=\"failure drill\", dtype=object).to_frame())",
         []),
        ("code", "if canary.get(\"dry_run\"):\n"
                 "    data = {\"dry_run\": True, \"plan\": canary[\"plan\"]}\n"
                 "else:\n"
                 "    parity.parity_gates(ctx, canary)\n"
                 "    data = {\"canary_pod\": canary[\"pod_id\"], \"canary_destroyed\": canary[\"destroyed\"],\n"
                 "            \"capacity_tries\": canary[\"capacity_tries\"],\n"
                 "            \"result\": {k: v for k, v in canary[\"result\"].items() if k != \"attempts\"}}\n"
                 + FINISH.format(data="data"), []),
    ],
    "04_compare_production": [
        ("md", "# 04 · Compare production characteristics\n\nIs the target as fast, as reliable and as cheap as "
               "claimed? Cold starts, interleaved rounds (S, T, T, S) of open-loop requests (latency from "
               "intended arrival: queue + init + inference) and saturation bursts (throughput), errors, and "
               "cost per accepted unit. Raw samples are kept as CSV next to this notebook.", []),
        ("code", OPEN.format(pid="04"), []),
        ("code", "from runbook_lib.phases import compare\n"
                 "from runbook_lib import report\n\n"
                 "res = compare.measure(ctx)\n"
                 "display(pd.DataFrame(res[\"cold_starts\"]))\n"
                 "summary = compare.summary(res)\n"
                 "display(summary)", []),
        ("code", "unit = \"request\" if ctx.mig.workload.kind == \"inference\" else \"training step\"\n"
                 "costs = compare.costs(ctx, res)\n"
                 "display(pd.DataFrame({s: c.to_dict() for s, c in costs.items()}))\n"
                 "figs = [report.latency_cdf(res[\"samples\"], ctx.path(\"04/latency_cdf.png\"), unit_label=unit),\n"
                 "        report.throughput_plot(res[\"throughput\"], ctx.path(\"04/throughput.png\"),\n"
                 "                               unit=\"requests/s\" if unit == \"request\" else \"samples/s\"),\n"
                 "        report.cost_plot(costs, ctx.path(\"04/cost.png\"), unit=unit)]", []),
        ("code", "compare.compare_gates(ctx, res, costs)\n"
                 + FINISH.format(data="compare.record_data(res, costs, summary)"), []),
    ],
    "05_cutover": [
        ("md", "# 05 · Cut over reversibly\n\nCan we move a bounded slice without losing data or the way back? "
               "The rollback point is recorded first; each slice step is checked before the next; a failed "
               "step restores the source at once.", []),
        ("code", OPEN.format(pid="05"), []),
        ("code", "from runbook_lib.phases import cutover\n\n"
                 "res = cutover.cutover(ctx)\n"
                 "display(pd.Series(res[\"rollback_point\"], name=\"rollback point\", dtype=object).to_frame())\n"
                 "display(pd.DataFrame(res[\"steps\"]))\n"
                 "display(pd.DataFrame(res[\"route\"][\"history\"]))", []),
        ("code", FINISH.format(data='{"cutover": res}'), []),
    ],
    "06_accept_or_rollback": [
        ("md", "# 06 · Accept or roll back\n\nGO or NO-GO, and can another operator verify why? Every gate, the "
               "decision path, the actions taken (route, teardown verified), and `receipt.json`.", []),
        ("code", OPEN.format(pid="06"), []),
        ("code", "from runbook_lib.phases import decide\n\n"
                 "display(pd.DataFrame(decide.phase_status(ctx)))\n"
                 "out = decide.decide_and_act(ctx)\n"
                 "display(gates_table(out[\"gates\"]))", []),
        ("code", "display(Markdown(f\"## Decision: **{out['decision']}**\\n\\n\" + \"\\n\".join(f\"- {r}\" for r in out[\"reasons\"])))\n"
                 "display(pd.DataFrame(out[\"receipt\"][\"acceptance_deltas\"]))\n"
                 "display(pd.DataFrame(out[\"actions\"][\"created\"]))", []),
        ("code", "record = ctx.finish({\"decision\": out[\"decision\"], \"reasons\": out[\"reasons\"]})  # hashes receipt.json\n"
                 "display(Markdown(f\"Record `{record.path.name}` · sha256 `{record.sha256}`\"))\n"
                 "manifest = decide.seal(ctx, out)  # manifest.json, then _SUCCESS last (the headless runner re-seals)\n"
                 "display(Markdown(f\"Sealed: `manifest.json` for run `{manifest['run_id']}`\"))", []),
    ],
}


def build(name: str) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    cells = [nbformat.v4.new_markdown_cell(NOTEBOOKS[name][0][1])]
    cells.append(new_code_cell(PARAMS, metadata={"tags": ["parameters"]}))
    for kind, src, tags in NOTEBOOKS[name][1:]:
        meta = {"tags": tags} if tags else {}
        cells.append(new_markdown_cell(src, metadata=meta) if kind == "md" else new_code_cell(src, metadata=meta))
    for i, c in enumerate(cells):
        c["id"] = f"{name[:2]}-{i:02d}"
    nb.cells = cells
    return nb


def main(out_dir: str = "notebooks") -> int:
    out = Path(out_dir)
    out.mkdir(exist_ok=True)
    for name in NOTEBOOKS:
        nbformat.write(build(name), out / f"{name}.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

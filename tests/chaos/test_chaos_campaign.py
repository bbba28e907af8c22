"""The campaign's pure parts: a row per run's summary, the markdown table, the doc block."""

from __future__ import annotations

from pathlib import Path

from chaos.campaign import BEGIN, END, row_of, table, write_into
from chaos.checker import SAFETY_KEYS


def _summary(safe: bool = True, lost: int = 0) -> dict:
    return {"safe": safe, "safety": {**{k: 0 for k in SAFETY_KEYS}, "lost": lost},
            "appends": {"invoked": 100, "acknowledged": 98},
            "faults": {"kill-primary": 2, "net-client:delay": 1, "net-client:reset": 1,
                       "delete-member-key": 1},
            "recovery_after_primary_kill_s": {"kills": 2, "recovered": 2, "p50": 5.1, "max": 6.2},
            "counts": {"unavailable_after_heal": 0, "stale_heads": 0},
            "run": {"skipped_faults": []}}


def test_row_of_a_summary() -> None:
    r = row_of(7, 120.0, _summary(), 300.0)
    assert r["seed"] == 7 and r["acknowledged"] == 98 and r["faults"] == 5
    assert r["faults_per_min"] == 2.5
    assert r["by_kind"] == {"delete-member-key": 1, "kill-primary": 2, "net-client": 2}
    assert r["recovery_max"] == 6.2 and r["safe"]


def test_table_and_doc_block(tmp_path: Path) -> None:
    rows = [row_of(1, 60.0, _summary(), 1.0), row_of(2, 60.0, _summary(False, lost=3), 1.0),
            row_of(3, 60.0, {"error": "RuntimeError('etcd')"}, 1.0)]
    text = table(rows)
    lines = text.strip().splitlines()
    assert lines[0].startswith("| seed | acked | faults (/min)")
    assert "| 2 | 98 | 5 (5.0) |" in text and "**NO**" in text and "run failed" in text
    assert "c-mismatch" in lines[0] and "c-dual" in lines[0]
    assert lines[-1].startswith("| **all** | 196 | 10 (5.0)") and "1/3 safe" in lines[-1]
    doc = tmp_path / "r.md"
    doc.write_text(f"# R\n\nbefore\n{BEGIN}\nold\n{END}\nafter\n")
    write_into(doc, "new table\n")
    assert doc.read_text() == f"# R\n\nbefore\n{BEGIN}\nnew table\n{END}\nafter\n"
    other = tmp_path / "o.md"
    write_into(other, "t\n")
    assert BEGIN in other.read_text()


def test_host_recovery_columns() -> None:
    hosted = _summary()
    hosted["run"]["host_recovery"] = {
        "isolate-host": {"faults": 3, "recovered": 3, "p50": 5.0, "max": 6.9, "each": [1, 2, 3]},
        "kill-host": {"faults": 2, "recovered": 1, "p50": 4.0, "max": 4.5, "each": [4.5]}}
    rows = [row_of(1, 60.0, hosted, 1.0), row_of(2, 60.0, _summary(), 1.0)]
    assert rows[0]["host_recovery"]["isolate-host"] == {"faults": 3, "recovered": 3,
                                                         "p50": 5.0, "max": 6.9}
    lines = table(rows).strip().splitlines()
    assert "isolate-host→ack p50 / max s" in lines[0] and "kill-host→ack" in lines[0]
    assert "| 5.0 / 6.9 (3/3) | 4.0 / 4.5 (1/2) |" in lines[2]
    assert "| — | — |" in lines[3]
    assert "max 6.9 (3/3)" in lines[-1] and "max 4.5 (1/2)" in lines[-1]
    assert "isolate-host" not in table([rows[1]])

"""The leaderboard's parts on their own, in milliseconds: its typed rows and their one dict/CSV
form, the names the package gives, and a record's note of a run lacking shards."""

from __future__ import annotations

import json

import pytest

from pytest_commbench import leaderboard
from pytest_commbench.leaderboard import files, rows
from pytest_commbench.record import ResultLine
from pytest_commbench.shards import headline_note


def _record(model: str, task: str, verdict: str, speedup: float | None, **more) -> dict:
    return {"event": "result", "model": model, "task": task, "nodeid": f"{task}::t[np2]",
            "verdict": verdict, "speedup": speedup, "kind": "solution", **more}


@pytest.fixture
def board() -> leaderboard.Board:
    recs = [_record("a", "t1", "pass", 1.2, run="r1", refine_rounds=1),
            _record("a", "t2", "wrong_answer", None, run="r1", refine_rounds=1),
            _record("b", "t1", "pass", 0.9, refine_rounds=1),  # a record naming no run
            _record("b", "t2", "pass", 1.5, refine_rounds=1)]
    return leaderboard.build(recs, resamples=50)


def test_a_leaderboard_row_is_typed_and_reads_as_its_dict(board):
    row = next(r for r in leaderboard.leaderboard_rows(board) if r.label == "a")
    assert isinstance(row, rows.LeaderboardRow)
    assert (row.tasks, row.passes, row.runs) == (2, 1, "r1")
    assert row.pass_rate == 0.5 and row.interval("pass_rate") == [row.pass_rate_lo,
                                                                   row.pass_rate_hi]
    data = row.as_dict()
    assert list(data) == list(leaderboard.COLUMNS) and list(row) == list(data)
    assert row == data and data == row and row["fast_1.5"] == row.fast_p(1.5)
    assert rows.LeaderboardRow.from_dict(data) == row
    with pytest.raises(AttributeError):
        row.rank = 9  # type: ignore[misc]  # frozen


def test_leaderboard_csv_reads_back_the_rows_with_their_types(board, tmp_path):
    files.write_csv(board, tmp_path / "leaderboard.csv")
    back = leaderboard.read_csv(tmp_path / "leaderboard.csv")
    assert back == leaderboard.leaderboard_rows(board)
    by_label = {r.label: r for r in back}
    assert by_label["b"].runs == ""  # text stays text, empty or not
    assert isinstance(by_label["a"].rank, int) and isinstance(by_label["a"].pass_rate, float)
    assert by_label["a"].open_weights is None and by_label["a"].price is None


def test_the_json_of_every_typed_table_is_the_rows_dicts(board):
    data = json.loads(json.dumps(leaderboard.to_json(board)))
    assert data["models"] == leaderboard.leaderboard_rows(board)
    assert data["cost_matched"] == [r.as_dict() for r in leaderboard.cost_matched(board)]


def test_every_name_of_the_leaderboard_is_importable_from_the_package():
    for name in leaderboard.__all__:
        assert getattr(leaderboard, name) is not None, name
    # the parts each do one job; the package re-exports them unchanged
    assert leaderboard.build is leaderboard.board.build
    assert leaderboard.render is leaderboard.text.render
    assert leaderboard.split is leaderboard.grouping.split


def test_a_records_partial_note_is_a_field_and_old_lines_have_none():
    old = ResultLine.from_json(_record("m", "t", "pass", 1.0))
    assert old.partial_note is None and "_shards_partial" not in old.to_json()
    assert headline_note([old]) == ""
    note = "PARTIAL: shard 1/2 of run x, missing 2/2"
    noted = old.evolve(partial_note=note)
    assert noted.to_json()["_shards_partial"] == note  # the mapping view: as it was
    assert ResultLine.from_json(noted.to_json()).partial_note == note
    assert headline_note([noted, old]) == f"   ({note})"
    assert headline_note([noted.to_json()]) == f"   ({note})"  # its JSON reads the same

"""Models asked over their APIs: the registry, the prompt, and whole runs through the real
SDKs against scripted servers on loopback (tests/llm_servers.py)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from pytest_commbench.models import prompt as prompts
from pytest_commbench.models.registry import RegistryError, load, resolve
from pytest_commbench.tasks import load_task

REPO = Path(__file__).resolve().parents[2]
TASK = "collective/ring_allreduce"

REF = (REPO / "references" / TASK / "solution.py").read_text()
TEMPLATE = (REPO / "suites" / TASK / "template.py").read_text()
README = (REPO / "README.md").read_text()
NODE = f"suites/{TASK}/task.toml::ring_allreduce[np2]"


def _region(text: str) -> str:
    return re.search(r"    # >>> COMMBENCH EDIT allreduce\n.*?    # <<< COMMBENCH EDIT\n", text,
                     re.S).group(0)


# -- the registry -----------------------------------------------------------------------------

def test_the_shipped_registry_has_the_papers_models_and_their_settings():
    specs = load()
    assert {"gpt-5.5", "gemini-3.1-pro", "claude-opus-4.7", "glm-5.1", "kimi", "qwen-3.7-max",
            "deepseek-v4-pro"} <= set(specs)
    assert specs["kimi"].key_env == "MOONSHOT_API_KEY" and specs["kimi"].open_weights
    assert specs["gpt-5.5"].reasoning_effort == "medium"
    assert specs["claude-opus-4.7"].provider == "anthropic"
    assert specs["claude-opus-4.7"].thinking == "adaptive"
    assert specs["qwen-3.7-max"].extra_body == {"enable_thinking": False}
    # no models-file price shipped: genai-prices' is the default (models/prices.py)
    assert specs["kimi"].cost(1000, 1000) is None and specs["kimi"].price_ref


def test_a_user_file_overrides_fields_and_adds_models(tmp_path):
    user = tmp_path / "models.toml"
    user.write_text('[models.kimi]\nprice_in = 0.6\nprice_out = 2.5\n'
                    '[models.local]\nprovider = "openai"\nmodel = "qwen-coder"\n'
                    'base_url = "http://127.0.0.1:8000/v1"\n')
    specs = load(user)
    assert specs["kimi"].model == "kimi-k2.6"  # the shipped fields stay
    assert specs["kimi"].cost(1_000_000, 2_000_000) == pytest.approx(0.6 + 5.0)
    assert specs["local"].key_env == "OPENAI_API_KEY"
    assert resolve("openai:my-model").model == "my-model"
    assert resolve("nonsense") is None


@pytest.mark.parametrize("text, needle", [
    ('[models.x]\nprovider = "openai"\nmodel = "m"\ncolour = 1\n', "models.x.colour: unknown key"),
    ('[models.x]\nprovider = "gopher"\nmodel = "m"\n', "models.x.provider"),
    ('[models.x]\nprovider = "openai"\n', "'model' is missing"),
    ('[models.x]\nprovider = "openai"\nmodel = "m"\nmax_tokens = "many"\n', "expected int"),
    ("[models\n", "not valid TOML"),
    ('[model.kimi]\nprice_in = 1.0\nprice_out = 2.0\n', "unknown table or key 'model'"),
    # prices and limits that would make costs lie or requests absurd
    ('[models.x]\nprovider = "openai"\nmodel = "m"\nprice_in = -1.0\nprice_out = 2.0\n',
     "models.x.price_in: must be a finite number >= 0"),
    ('[models.x]\nprovider = "openai"\nmodel = "m"\nprice_in = 1.0\nprice_out = inf\n',
     "models.x.price_out: must be a finite number >= 0"),
    ('[models.x]\nprovider = "openai"\nmodel = "m"\nmax_tokens = 0\n', "models.x.max_tokens"),
    ('[models.x]\nprovider = "openai"\nmodel = "m"\nmax_tokens = -5\n', "models.x.max_tokens"),
])
def test_a_bad_registry_file_names_file_and_key(tmp_path, text, needle):
    user = tmp_path / "models.toml"
    user.write_text(text)
    with pytest.raises(RegistryError, match=re.escape(needle)) as info:
        load(user)
    assert str(user) in str(info.value)


def test_the_prompt_has_the_task_the_template_the_platform_and_the_contract():
    task = load_task(REPO / "suites" / TASK / "task.toml", REPO / "suites")
    text = prompts.build(task, {"platform": "cpu", "mpi": "mpiexec (Open MPI) 5.0"})
    assert (REPO / "suites" / TASK / "prompt.md").read_text().strip()[:200] in text
    assert TEMPLATE.rstrip() in text
    assert "- mpi: mpiexec (Open MPI) 5.0" in text and "regions: allreduce" in text
    assert _region(REF) not in text  # never the reference


# -- whole runs against scripted servers ------------------------------------------------------

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _servers():
    return pytest.importorskip("llm_servers", reason="the scripted servers")


def _run(bench, monkeypatch, kind, script, *args, key=True, add=True, real=False):
    """The run against the scripted server: on the fake job runner (in this process) unless
    `real` (the answer's own verdict or timing is what the test reads)."""
    pytest.importorskip(kind)
    if add:
        bench.add_task(TASK, ranks=2)
    var = "OPENAI_API_KEY" if kind == "openai" else "ANTHROPIC_API_KEY"
    if key:
        monkeypatch.setenv(var, "test-key")
    else:
        monkeypatch.delenv(var, raising=False)
    with _servers().ScriptedServer(kind, script) as srv:
        model = "openai:coder" if kind == "openai" else "anthropic:coder"
        run = bench.run if real else bench.run_fake
        result = run(f"--commbench-model={model}", f"--commbench-base-url={srv.base_url}",
                     "--commbench-request-timeout=2", *args)
    return result, srv.requests


def _only(bench) -> dict:
    (record,) = [r for r in bench.records() if r["nodeid"] == NODE]
    return record


@pytest.mark.parametrize("reply, verdict", [
    (f"Here it is:\n```python\n{REF}```\n", "pass"),                       # the whole file, fenced
    (_region(REF), "pass"),                                                # the region alone
    (f"```python\n{TEMPLATE}```", "runtime_error"),                        # the template: raises
    ("I cannot do this.", "no_solution"),                                  # no code at all
    (REF.replace("import numpy as np", "import numpy as np  # mine"), "tampered"),  # outside
])
def test_replies_of_every_shape_get_their_verdict(bench, monkeypatch, reply, verdict):
    # (the template's own failure needs real ranks; the other verdicts come before any job)
    result, requests = _run(bench, monkeypatch, "openai",
                            [{"text": reply, "usage": {"in": 1500, "out": 700}}],
                            real=verdict == "runtime_error")
    record = _only(bench)
    assert record["verdict"] == verdict, (record["message"], result.stdout.str()[-1500:])
    assert len(requests) == 1
    assert record["tokens_in"] == 1500 and record["tokens_out"] == 700
    sent = requests[0]["body"]
    assert sent["model"] == "coder"
    assert TEMPLATE.rstrip() in sent["messages"][-1]["content"]


def test_a_passing_reply_is_kept_and_a_second_run_sends_nothing(bench, monkeypatch):
    script = [{"text": f"```python\n{REF}```"}]
    _run(bench, monkeypatch, "openai", script)
    first = _only(bench)["verdict"]
    kept = list((bench.root / "runs" / "replies").rglob("reply.md"))
    assert len(kept) == 1 and (kept[0].parent / "prompt.md").is_file()
    usage = json.loads((kept[0].parent / "usage.json").read_text())
    assert usage["tokens_in"] > 0 and usage["model"]["model"] == "coder"
    # the same runs dir: the kept reply is used, the server (a new one) hears nothing
    with _servers().ScriptedServer("openai", [{"status": 500}]) as srv:
        bench.run_fake("--commbench-model=openai:coder", f"--commbench-base-url={srv.base_url}")
        assert srv.all_requests == []  # not even a model list
    verdicts = [r["verdict"] for r in bench.records() if r["nodeid"] == NODE]
    assert verdicts == [first, first] == ["pass", "pass"]


def test_the_anthropic_sdk_is_spoken_too(bench, monkeypatch):
    _, requests = _run(bench, monkeypatch, "anthropic", [{"text": _region(REF)}])
    assert _only(bench)["verdict"] == "pass"
    headers = requests[0]["headers"]  # the SDK's version decides which header carries it
    assert "test-key" in (headers.get("x-api-key", ""), headers.get("authorization", "")[7:])


def test_a_rate_limit_is_retried(bench, monkeypatch):
    _, requests = _run(bench, monkeypatch, "openai",
                       [{"status": 429}, {"text": _region(REF)}])
    assert _only(bench)["verdict"] == "pass" and len(requests) == 2


@pytest.mark.parametrize("script, needle", [
    ([{"status": 500}], "InternalServerError"),
    ([{"delay_s": 6, "text": "late"}], "Timeout"),
])
def test_an_outage_is_an_infra_error_and_the_session_goes_on(bench, monkeypatch, script, needle):
    result, _ = _run(bench, monkeypatch, "openai", script)
    record = _only(bench)
    assert record["verdict"] == "infra_error" and needle in record["message"], record["message"]
    assert "Traceback" not in result.stdout.str()
    assert not list((bench.root / "runs" / "replies").rglob("reply.md"))  # nothing kept


def test_a_missing_key_is_a_usage_error_naming_the_variable(bench, monkeypatch):
    """Refused before any item runs (the preflight), and nothing is sent."""
    result, requests = _run(bench, monkeypatch, "openai", [{"text": "x"}], key=False)
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "OPENAI_API_KEY" in result.stderr.str()
    assert requests == [] and bench.records() == []


@pytest.mark.parametrize("kind, status", [("openai", 401), ("anthropic", 403)])
def test_a_refused_key_stops_the_session_at_the_first_item(bench, monkeypatch, kind, status):
    """Two tasks, an endpoint that refuses the key: one request, one item failed as an
    infra_error (not retried), then the session stops with one line naming the key's
    variable; the other task is never asked."""
    bench.add_task(TASK, ranks=2)
    bench.add_task(TASK, ranks=2, name="ring_allreduce_b")
    result, requests = _run(bench, monkeypatch, kind, [{"status": status}], "-p", "no:randomly",
                            add=False)
    out = result.stdout.str()
    var = "OPENAI_API_KEY" if kind == "openai" else "ANTHROPIC_API_KEY"
    assert result.ret == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert len(requests) == 1
    (record,) = bench.records()
    assert record["verdict"] == "infra_error" and record["requests"][0]["refused"] == status
    (line,) = [x for x in out.splitlines() if "Interrupted: commbench: the endpoint refused" in x]
    assert f"({status})" in line and var in line and "no further item is asked" in line


def test_a_provider_sdk_that_does_not_import_is_refused_before_any_item(bench, monkeypatch,
                                                                        tmp_path):
    """Without the SDK the session is refused at once (exit status 4), with one line naming
    the README's install command for the providers' SDKs; nothing is asked."""
    from pytest_commbench.models.providers import SDK_INSTALL

    shadow = tmp_path / "shadow" / "openai"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'openai'\")\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(shadow.parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
    result, requests = _run(bench, monkeypatch, "openai", [{"text": _region(REF)}], real=True)
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, err
    assert f"the openai SDK cannot be imported (No module named 'openai'); install the " \
           f"providers' SDKs with {SDK_INSTALL}" in err
    assert SDK_INSTALL in README  # the command the README gives
    assert requests == [] and bench.records() == []


def test_an_unknown_or_broken_model_name_is_a_usage_error(bench, tmp_path):
    bench.add_task(TASK, ranks=2)
    result = bench.run_fake("--commbench-model=openai:")
    assert result.ret != 0 and "needs a model id" in result.stderr.str()
    bad = tmp_path / "m.toml"
    bad.write_text("[models.x]\nprovider = 1\n")
    result = bench.run_fake("--commbench-model=x", f"--commbench-models-file={bad}")
    assert result.ret != 0 and "models.x" in result.stderr.str()


def test_refinement_rounds_feed_the_verdict_back_and_price_every_round(bench, monkeypatch,
                                                                       tmp_path):
    """Wrong first (the template raises), right second: the task passes in round 2, the
    second request carries the first verdict and its evidence, both rounds are priced, and a
    second invocation on the same runs dir asks nothing and gives the same verdict."""
    pytest.importorskip("openai")
    bench.add_task(TASK, ranks=2)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    models = tmp_path / "models.toml"
    models.write_text('[models.scripted]\nprovider = "openai"\nmodel = "coder"\n'
                      'price_in = 1.0\nprice_out = 2.0\n')
    script = [{"text": f"```python\n{TEMPLATE}```", "usage": {"in": 1000, "out": 500}},
              {"text": _region(REF), "usage": {"in": 3000, "out": 500}}]
    args = ["--commbench-model=scripted", f"--commbench-models-file={models}",
            "--commbench-rounds=3", "--junitxml=out.xml"]
    with _servers().ScriptedServer("openai", script) as srv:
        result = bench.run(*args, f"--commbench-base-url={srv.base_url}")
        requests = list(srv.requests)
    record = _only(bench)
    assert record["verdict"] == "pass" and record["round"] == 2, record
    assert [h["verdict"] for h in record["round_history"]][:2] == ["runtime_error", "pass"]
    second = requests[1]["body"]["messages"][-1]["content"]
    assert "verdict: runtime_error" in second and "NotImplementedError" in second
    assert "Round 2" in second and TEMPLATE.splitlines()[-2].strip() in second
    rounds = len(requests)  # 2, or 3 where round 2 passed slower than the reference
    assert record["rounds"] == rounds
    want = (1000 * 1 + 500 * 2 + 3000 * 1 + 500 * 2 + (rounds - 2) * (3000 + 1000)) / 1e6
    assert record["cost"] == pytest.approx(want)
    assert 'name="commbench.round" value="2"' in (bench.root / "out.xml").read_text()
    assert "tasks passed by refinement round (cumulative): r1: 0, r2: 1" in result.stdout.str()
    with _servers().ScriptedServer("openai", [{"status": 500}]) as srv:
        bench.run(*args, f"--commbench-base-url={srv.base_url}")
        # the kept replies are replayed, and the conversation ends where it ended before
        # (even where this run times round 2 differently)
        assert srv.all_requests == []  # not even a model list
    again = [r for r in bench.records() if r["nodeid"] == NODE][-1]
    assert again["verdict"] == "pass" and again["round"] == 2


def test_a_pass_whose_timing_cannot_be_read_asks_for_no_faster_round(bench, monkeypatch):
    """Timed with one timing round (so no interval: the band is inconclusive), round 1 passes
    with an answer far slower than the reference (it sleeps in every call): the speedup is
    below 1 but not readable, so no second, paid request is sent."""
    (bench.root / "pytest.ini").write_text(
        (bench.root / "pytest.ini").read_text().replace("commbench_check_only = true\n", ""))
    slow = _region(REF).replace("    n, rank = comm.Get_size(), comm.Get_rank()\n",
                                "    import time\n    time.sleep(0.002)\n"
                                "    n, rank = comm.Get_size(), comm.Get_rank()\n")
    result, requests = _run(bench, monkeypatch, "openai", [{"text": slow}, {"text": _region(REF)}],
                            "--commbench-rounds=2", real=True)
    record = _only(bench)
    assert record["verdict"] == "pass" and record.get("speedup") is not None, record
    assert record.get("band") == "inconclusive", record
    if record.get("timing_trust") != "contended":  # a loaded host's number says nothing
        assert record["speedup"] < 1, record
    assert len(requests) == 1 and record["rounds"] == 1, result.stdout.str()


@pytest.mark.parametrize("trust, interval, speedup, asked", [
    ("contended", [0.064, 9.6], 0.877, False),  # the case: a contended 0.877
    ("shared", [0.50, 0.55], 0.52, False),
    ("ok", None, 0.5, False),  # no interval (one timing round): inconclusive
    ("noisy", [0.40, 2.0], 0.9, False),  # the interval spans bands: inconclusive
    ("ok", [0.40, 0.55], 0.47, True),  # readable, Severely degraded
    ("ok", [1.30, 1.40], 1.35, False),  # readable, faster than the reference
    (None, None, 0.8, True),  # a runner that records no trust: the speedup as it stands
    (None, None, None, False),  # untimed (check only)
])
def test_only_a_readable_speedup_below_one_asks_for_speed(trust, interval, speedup, asked):
    from pytest_commbench.engine import ItemResult
    from pytest_commbench.engine.refinement import wants_speed

    result = ItemResult("pass", speedup=speedup, speedup_ci90=interval, timing_trust=trust)
    assert wants_speed(result) is asked


def test_samples_are_items_of_their_own_and_pass_at_k_is_reported(bench, monkeypatch):
    """Three independent answers (one wrong): three items, pass@1 2/3, pass@2 and pass@3 1;
    each request carries the registry's or the command line's temperature."""
    result, requests = _run(bench, monkeypatch, "openai",
                            [{"text": _region(REF)}, {"text": "no code"},
                             {"text": _region(REF)}],
                            "--commbench-samples=3", "--commbench-temperature=0.7",
                            "-p", "no:randomly")
    verdicts = sorted(r["verdict"] for r in bench.records())
    assert verdicts == ["no_solution", "pass", "pass"]
    assert sorted(r["candidate"] for r in bench.records()) == ["s0", "s1", "s2"]
    assert len(requests) == 3 and all(r["body"]["temperature"] == 0.7 for r in requests)
    result.stdout.fnmatch_lines(["*pass@k over the samples: pass@1 66.7%, pass@2 100.0%, "
                                 "pass@3 100.0%*"])


def test_a_spent_budget_stops_the_rounds(bench, monkeypatch, tmp_path):
    pytest.importorskip("openai")
    bench.add_task(TASK, ranks=2)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    models = tmp_path / "models.toml"
    models.write_text('[models.scripted]\nprovider = "openai"\nmodel = "coder"\n'
                      'price_in = 1.0\nprice_out = 1.0\n')
    # every answer is wrong and costs $0.01: a $0.015 budget allows two rounds of five
    with _servers().ScriptedServer("openai", [{"text": "no code",
                                               "usage": {"in": 5000, "out": 5000}}]) as srv:
        bench.run_fake("--commbench-model=scripted", f"--commbench-models-file={models}",
                  "--commbench-rounds=5", "--commbench-budget-usd=0.015",
                  f"--commbench-base-url={srv.base_url}")
        assert len(srv.requests) == 2
    record = _only(bench)
    assert record["rounds"] == 2 and record["cost"] == pytest.approx(0.02)


def test_kept_answers_export_to_the_dir_layout(bench, monkeypatch, tmp_path):
    from pytest_commbench.cli import main

    _run(bench, monkeypatch, "openai", [{"text": _region(REF)}])
    out = tmp_path / "export"
    assert main(["export", str(bench.root / "runs" / "replies" / "openai_coder"), str(out)]) == 0
    assert (out / TASK / "reply.md").read_text() == _region(REF)


def test_a_rerun_ends_the_conversation_where_it_ended_before(monkeypatch, tmp_path):
    """Round 2 passes faster in the first run (the conversation ends there) and slower in the
    rerun: the rerun still stops at round 2 and asks for no round 3; a run that used all its
    rounds leaves no end, so raising --commbench-rounds asks further."""
    from pytest_commbench.engine import ItemResult, Settings, refinement
    from pytest_commbench.models.base import Candidate, Reply

    asked: list[int] = []
    ends: dict[int, int] = {}
    speedups = iter([None, 1.2, None, 0.8, None, 0.8, 0.9])

    def evaluate(task, world, answer, platform, settings, runner, kind="solution"):
        assert isinstance(answer, Reply) and kind == "solution"  # the answer as a value
        speedup = next(speedups)
        return ItemResult("pass" if speedup else "wrong_answer", speedup=speedup)

    monkeypatch.setattr(refinement, "evaluate", evaluate)
    class Conversation:  # the strategy's view of a conversation (models.base.Asking)
        def again(self, round_, previous, feedback):
            return asked.append(round_) or Reply("x")

        def ended(self, world):
            return ends.get(world)

        def end(self, world, round_):
            ends[world] = round_

    candidate = Candidate("", "solution", lambda: asked.append(1) or Reply("x"),
                          conversation=Conversation())
    settings = Settings(seed=1, work=tmp_path, cache=tmp_path, references=tmp_path, rounds=3)
    first = refinement.refine(None, 2, candidate, None, settings)
    assert (asked, ends, first.round_history[-1].round) == ([1, 2], {2: 2}, 2)
    asked.clear()
    again = refinement.refine(None, 2, candidate, None, settings)
    assert asked == [1, 2] and again.rounds == 2 and again.speedup == 0.8
    ends.clear()
    asked.clear()
    refinement.refine(None, 2, candidate, None, settings)  # nothing ended: all 3 rounds
    assert asked == [1, 2, 3] and ends == {}


# -- endpoints, prices, replays -----------------------------------------------------------------

CUT = {"openai": "length", "anthropic": "max_tokens"}


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_reply_cut_at_the_token_limit_is_truncated_and_never_run(bench, monkeypatch, kind):
    """A reply that would pass, but cut at the output limit: verdict `truncated` (a model
    failure that fails the item and counts against the model), neither built nor run, its
    message naming the limit asked (--commbench-max-tokens)."""
    from pytest_commbench.scoring import score

    result, requests = _run(bench, monkeypatch, kind,
                            [{"text": _region(REF), "finish": CUT[kind]}],
                            "--commbench-max-tokens=1234")
    record = _only(bench)
    assert record["verdict"] == "truncated", record["message"]
    assert "cut at the output limit (1234 tokens)" in record["message"]
    assert "--commbench-max-tokens" in record["message"]
    assert record["requests"][0]["finish_reason"] == CUT[kind]
    sent = requests[0]["body"]
    assert sent["max_completion_tokens" if kind == "openai" else "max_tokens"] == 1234
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*verdict truncated*"])
    assert not list((bench.root / "runs").rglob("solution.py"))  # never built
    scores = score(bench.records())
    assert (scores.applicable, scores.passes) == (1, 0)  # a fail, not "not applicable"


def _kimi_answers_once(bench, monkeypatch, *args: str) -> str:
    """A run of kimi against a loopback server whose one answer is the reference's region
    (1500 tokens in, 700 out: $0.004225 at genai-prices'); exactly one request is sent.
    Returns the server's address."""
    pytest.importorskip("openai")
    monkeypatch.setenv("MOONSHOT_API_KEY", "test-key")
    script = [{"text": _region(REF), "usage": {"in": 1500, "out": 700}}]
    with _servers().ScriptedServer("openai", script) as srv:
        bench.run_fake("--commbench-model=kimi", f"--commbench-base-url={srv.base_url}", *args)
        assert len(srv.requests) == 1
    return srv.base_url


def test_a_registry_model_is_priced_by_genai_prices_and_a_rerun_replays_its_cost(
        bench, monkeypatch):
    """Kimi (genai-prices: moonshotai kimi-k2.6 at $0.95 in / $4.00 out per million tokens):
    1500 tokens in and 700 out cost 1500 * 0.95e-6 + 700 * 4e-6 = $0.004225. The result line
    lists the request (endpoint, model id, settings, usage) and the price source; a rerun on
    the same runs directory sends nothing, and its line has the same cost and tokens, marked
    replayed."""
    bench.add_task(TASK, ranks=2)
    base_url = _kimi_answers_once(bench, monkeypatch)
    first = _only(bench)
    assert first["verdict"] == "pass" and first["cost"] == pytest.approx(0.004225)
    assert first["replayed"] is False
    source = first["price_source"]
    assert source["source"] == "genai-prices" and source["version"] == "0.2.3"
    assert (source["provider"], source["model"]) == ("moonshotai", "kimi-k2.6")
    assert source["data_date"]
    (request,) = first["requests"]
    assert request["endpoint"].rstrip("/") == base_url and request["model"] == "kimi-k2.6"
    assert request["max_tokens"] == 65536 and request["stream"] is True  # the registry's
    assert (request["tokens_in"], request["tokens_out"]) == (1500, 700)
    assert request["finish_reason"] == "stop" and request["seconds"] >= 0
    assert request["cost"] == pytest.approx(0.004225) and request["replayed"] is False
    (usage_file,) = (bench.root / "runs" / "replies").rglob("usage.json")
    usage = json.loads(usage_file.read_text())
    assert usage["price"] == source and usage["request"]["model"] == "kimi-k2.6"
    with _servers().ScriptedServer("openai", [{"status": 500}]) as srv:
        bench.run("--commbench-model=kimi", f"--commbench-base-url={srv.base_url}")
        assert srv.all_requests == []  # not even a model list
    again = [r for r in bench.records() if r["nodeid"] == NODE][-1]
    assert again["run"] != first["run"] and again["verdict"] == "pass"
    assert again["cost"] == pytest.approx(first["cost"]) and again["replayed"] is True
    assert (again["tokens_in"], again["tokens_out"]) == (1500, 700)
    assert again["requests"][0]["replayed"] is True and again["price_source"] == source


INFRA_ONCE = """
from pytest_commbench.engine import flow
from pytest_commbench.engine.plan import InfraError

_real, _calls = flow.measure, [0]


def measure(*args, **kwargs):
    _calls[0] += 1
    if _calls[0] == 1:
        raise InfraError("the machine hiccuped (a test's fault)")
    return _real(*args, **kwargs)


flow.measure = measure
"""


def test_an_item_retried_after_an_infra_error_keeps_the_cost_of_the_answer_it_asked(
        bench, monkeypatch):
    """The first attempt asks the model and then meets an infra_error; the retry judges the
    kept answer (no second request). The record is the retry's verdict with the answer's
    tokens and cost, counted once (it was $0 before: the retry replays at no cost and the
    attempt that paid was dropped)."""
    bench.add_task(TASK, ranks=2)
    (bench.root / "conftest.py").write_text(INFRA_ONCE)
    _kimi_answers_once(bench, monkeypatch)
    record = _only(bench)
    assert record["verdict"] == "pass", record["message"]
    assert record["cost"] == pytest.approx(0.004225)
    assert (record["tokens_in"], record["tokens_out"]) == (1500, 700)
    assert len(record["requests"]) == 1  # the kept answer the retry judged


def test_a_models_file_price_overrides_genai_prices_in_a_run(bench, monkeypatch, tmp_path):
    pytest.importorskip("openai")
    bench.add_task(TASK, ranks=2)
    monkeypatch.setenv("MOONSHOT_API_KEY", "test-key")
    models = tmp_path / "models.toml"
    models.write_text("[models.kimi]\nprice_in = 1.0\nprice_out = 2.0\n")
    script = [{"text": _region(REF), "usage": {"in": 1500, "out": 700}}]
    with _servers().ScriptedServer("openai", script) as srv:
        bench.run_fake("--commbench-model=kimi", f"--commbench-models-file={models}",
                  f"--commbench-base-url={srv.base_url}")
    record = _only(bench)
    assert record["cost"] == pytest.approx((1500 * 1.0 + 700 * 2.0) / 1e6)  # not 0.004225
    assert record["price_source"] == {"source": "models file", "price_in": 1.0,
                                      "price_out": 2.0}


def test_a_budget_with_a_model_of_unknown_price_is_a_usage_error(bench, monkeypatch):
    """openai:coder on a local server has no price: a budget could never stop its rounds."""
    result, requests = _run(bench, monkeypatch, "openai", [{"text": _region(REF)}],
                            "--commbench-budget-usd=0.5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    stderr = result.stderr.str()
    assert "needs the price of model openai:coder" in stderr and "price_in" in stderr
    assert requests == [] and bench.records() == []


def test_the_budget_counts_replayed_answers_at_every_world_size_and_on_a_rerun(
        bench, monkeypatch, tmp_path):
    """Two world sizes share each round's answer ($0.01 each, every one wrong) under a
    $0.015 budget: np2 asks rounds 1 and 2, np4 replays them, and both stop at round 2 (the
    replayed cost counts toward np4's budget), so two requests in all; the run's spend, each
    answer counted once, is $0.02. A rerun replays both rounds, stops at round 2 at both
    sizes, sends nothing and reports the same spend."""
    from pytest_commbench.scoring import per_task

    pytest.importorskip("openai")
    bench.add_task(TASK, ranks="2, 4")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    models = tmp_path / "models.toml"
    models.write_text('[models.scripted]\nprovider = "openai"\nmodel = "coder"\n'
                      'price_in = 1.0\nprice_out = 1.0\n')
    args = ["--commbench-model=scripted", f"--commbench-models-file={models}",
            "--commbench-rounds=5", "--commbench-budget-usd=0.015", "-p", "no:randomly"]
    script = [{"text": "no code", "usage": {"in": 5000, "out": 5000}}]
    with _servers().ScriptedServer("openai", script) as srv:
        bench.run(*args, f"--commbench-base-url={srv.base_url}")
        assert len(srv.requests) == 2
    first = bench.records()
    assert sorted(r["world"] for r in first) == [2, 4]
    assert [r["rounds"] for r in first] == [2, 2]
    assert sum(r["cost"] for r in first) == pytest.approx(0.02)
    assert all(len(r["requests"]) == 2 and sum(q["cost"] for q in r["requests"])
               == pytest.approx(0.02) for r in first)
    assert per_task(first)[0]["cost"] == pytest.approx(0.02)
    with _servers().ScriptedServer("openai", [{"status": 500}]) as srv:
        bench.run(*args, f"--commbench-base-url={srv.base_url}")
        assert srv.all_requests == []  # not even a model list
    again = bench.records()[len(first):]
    assert [r["rounds"] for r in again] == [2, 2] and all(r["replayed"] for r in again)
    assert per_task(again)[0]["cost"] == pytest.approx(0.02)


# -- prompts and hints ---------------------------------------------------------------------------

HINTED = "collective/twoshot_allreduce_ipc"


def test_a_prompt_is_the_contract_and_its_hints_come_only_when_asked():
    task = load_task(REPO / "suites" / HINTED / "task.toml", REPO / "suites")
    hints = task.hints.read_text().strip()
    plain = prompts.build(task, {"platform": "h200"})
    hinted = prompts.build(task, {"platform": "h200"}, hints=True)
    assert hints[:200] not in plain and "## Hints" not in plain
    assert hints[:200] in hinted and hinted.startswith(plain.rstrip()[:500])
    # how every call is made and checked, stated once for every task: ownership, the late
    # rank (where the task has one), the calls back to back with a rank held back
    assert "until a rank's call has begun, its buffers belong to its caller" in plain
    assert "no synchronization between them" in plain and "on its device" in plain
    # the harness's C ABI is part of the contract: the header the template includes, whole
    header = (REPO / "pytest_commbench" / "include" / "commbench.h").read_text().rstrip()
    assert header in plain and "The harness's header `commbench.h`" in plain
    copy = load_task(REPO / "suites" / "p2p" / "sm_peer_copy" / "task.toml", REPO / "suites")
    assert not copy.check.late_rank
    assert "one rank late" not in prompts.build(copy, {"platform": "h200"})


def test_every_gpu_task_has_hints_apart_from_its_contract():
    from pytest_commbench.tasks import load_suite

    tasks, errors = load_suite(REPO / "suites")
    assert not errors
    gpu = [t for t in tasks if set(t.platforms) - {"cpu"}]
    missing = [t.relpath for t in gpu if t.hints is None]
    assert not missing, f"GPU tasks without hints.md: {missing}"
    for t in gpu:  # the method is in the hints: the contract names no memory scope
        text = t.prompt.read_text()
        assert "st.release.sys" not in text and "ld.acquire.sys" not in text, t.relpath


def test_commbench_prompt_prints_what_a_model_is_sent(capsys, tmp_path):
    from pytest_commbench.cli import main

    assert main(["prompt", HINTED, "--suites", str(REPO / "suites")]) == 0
    out = capsys.readouterr().out
    assert "## How every call is made and checked" in out and "## Hints" not in out
    assert main(["prompt", HINTED, "--suites", str(REPO / "suites"), "--hints"]) == 0
    assert "## Hints" in capsys.readouterr().out
    facts = tmp_path / "fp.json"
    facts.write_text(json.dumps({"platform": "h200", "gpu": "NVIDIA H200", "nccl": "2.28.9"}))
    assert main(["prompt", HINTED, "--suites", str(REPO / "suites"), "--fingerprint",
                 str(facts)]) == 0
    assert "- nccl: 2.28.9" in capsys.readouterr().out
    assert main(["prompt", "collective/no_such_task", "--suites", str(REPO / "suites")]) == 2
    assert "no task" in capsys.readouterr().err


def test_a_run_with_hints_is_kept_and_scored_apart(bench, monkeypatch):
    suite = bench.add_task(TASK, ranks=2)
    (suite / "hints.md").write_text("Sum with a ring: reduce-scatter, then all-gather.\n")
    script = [{"text": f"```python\n{REF}```"}]
    _, requests = _run(bench, monkeypatch, "openai", script, "--commbench-hints", add=False)
    sent = json.dumps(requests)
    assert "Sum with a ring: reduce-scatter" in sent
    record = _only(bench)
    assert record["verdict"] == "pass" and record["hints"] is True
    kept = list((bench.root / "runs" / "replies").rglob("reply.md"))
    assert len(kept) == 1 and "openai_coder_hints" in str(kept[0])
    # without hints the kept reply is not the one to replay: the model is asked again
    _run(bench, monkeypatch, "openai", script, add=False)
    records = [r for r in bench.records() if r["nodeid"] == NODE]
    assert [r.get("hints") for r in records] == [True, None]
    assert len(list((bench.root / "runs" / "replies").rglob("reply.md"))) == 2


def test_commbench_tasks_upstream_says_what_the_suite_covers_in_the_examples_own_library(capsys):
    from pytest_commbench.cli import example_library, main, upstream_coverage
    from pytest_commbench.tasks import load_suite

    assert example_library("example086_mscclpp_alltoall_hard") == "mscclpp"
    assert example_library("example095_msclpp_allreduce_rsag_zero_hard") == "mscclpp"
    assert example_library("example043_nccl_device_api_intranode_allreduce") == "nccl-device"
    assert example_library("example073_GPU_p2p_pingpong_latency") == "cuda-runtime"
    tasks, _ = load_suite(REPO / "suites")
    rows = {name: (lib, status, named) for name, lib, status, named in upstream_coverage(tasks)}
    assert len(rows) == 101
    # an MSCCL++ example posed in plain CUDA is only partly covered; NVSHMEM's own are covered
    lib, status, named = rows["example096_mscclpp_mc_put_hard"]
    assert lib == "mscclpp" and status == "partly" and "p2p/memory_channel_put" in named
    assert rows["example033_nvshmem_put_and_signal"][1] == "covered"
    assert all(s == "none" for lib, s, _ in rows.values() if lib == "ibverbs")
    assert main(["tasks", str(REPO / "suites"), "--upstream"]) == 0
    assert "101 examples: covered" in capsys.readouterr().out


def test_a_resumed_item_that_had_asked_counts_its_answer_once(bench, monkeypatch):
    """Two world sizes share one answer ($0.004225). The run is killed after np2 (which
    asked) ran but before its result line was written, np3 (which replayed, counting
    nothing) having finished. The resume runs np2 again: it replays its own answer and
    counts it, so the run's cost holds it once (it held it nowhere before: $0)."""
    suite = bench.add_task(TASK, ranks=2)
    manifest = suite / "task.toml"
    manifest.write_text(manifest.read_text().replace("ranks = [2]", "ranks = [2, 3]"))
    _kimi_answers_once(bench, monkeypatch, "-p", "no:randomly")
    (run,) = [p for p in (bench.root / "runs").iterdir() if p.is_dir() and p.name != "replies"]
    log = run / "results.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    asker = next(i for i, x in enumerate(lines)
                 if json.loads(x)["event"] == "result" and json.loads(x)["nodeid"] == NODE)
    assert json.loads(lines[asker])["cost"] == pytest.approx(0.004225)
    log.write_text("".join(lines[:asker] + lines[asker + 1:]))  # killed before it was written
    with _servers().ScriptedServer("openai", [{"status": 500}]) as srv:
        bench.run_fake("--commbench-model=kimi", f"--commbench-base-url={srv.base_url}",
                  f"--commbench-resume={run}")
        assert srv.requests == []  # the kept answer, not asked again
    from pytest_commbench.results import load

    records = load(log)
    assert {r["verdict"] for r in records} == {"pass"} and len(records) == 2
    assert sum(r["cost"] for r in records) == pytest.approx(0.004225)

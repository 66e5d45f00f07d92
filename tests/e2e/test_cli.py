import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "specserve.cli.main", *args], capture_output=True, text=True, timeout=300)


def test_generate_streams_text_and_timing_line():
    r = run("generate", "def add(a, b):", "--max-tokens", "12")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "tokens/s" in r.stderr and "time to first token" in r.stderr


def test_n_samples_print_each():
    r = run("generate", "Hi", "--chat", "-n", "2", "--temperature", "0.8", "--seed", "1", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "--- sample 0 ---" in r.stdout and "--- sample 1 ---" in r.stdout


def test_chat_holds_the_conversation_as_llm_chat_would(embedded_llm):
    """Each answer is LLM.chat's over the conversation so far (greedy); /clear, a block of several lines
    and /system change the conversation as they say; later turns' prompts come from the prefix cache."""
    from specserve import SamplingParams
    greedy = SamplingParams(temperature=0, max_tokens=24)
    q1, q2 = "What is the capital of France?", "And of Italy?"
    a1 = embedded_llm.chat([{"role": "user", "content": q1}], greedy)[0].outputs[0].text
    a2 = embedded_llm.chat([{"role": "user", "content": q1}, {"role": "assistant", "content": a1},
                            {"role": "user", "content": q2}], greedy)[0].outputs[0].text
    a3 = embedded_llm.chat([{"role": "user", "content": "Say hi\nin French"}], greedy)[0].outputs[0].text
    a4 = embedded_llm.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": q1}],
                           greedy)[0].outputs[0].text
    typed = f'{q1}\n{q2}\n/clear\n"""Say hi\nin French\n"""\n/system Be brief.\n{q1}\n/bye\n{q2}\n'
    r = subprocess.run([sys.executable, "-m", "specserve.cli.main", "chat", "--max-tokens", "24", "--stats"], input=typed,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{a1}\n{a2}\n{a3}\n{a4}\n"  # nothing after /bye
    stats = [line for line in r.stderr.splitlines() if "prompt tokens from the prefix cache" in line]
    assert len(stats) == 4 and stats[0].split(", ")[-1].startswith("0 of") and not stats[1].split(", ")[-1].startswith("0 of")


def test_ctrl_c_stops_a_chat_answer_and_the_conversation_goes_on():
    import signal
    p = subprocess.Popen([sys.executable, "-m", "specserve.cli.main", "chat", "--max-tokens", "400"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        p.stdin.write("Count from 1 to 200, separated by spaces.\n")
        p.stdin.flush()
        first = p.stdout.read(1)  # the answer has begun
        p.send_signal(signal.SIGINT)
        p.stdin.write("What is the capital of France?\n")
        p.stdin.close()
        p.stdin = None
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 0 and err.strip() == "[stopped]", err
    stopped, answer = (first + out).split("\n")[:2]
    assert stopped and " 200" not in stopped and "Paris" in answer


@pytest.mark.parametrize("args", [["--max-tokens", "-1"], ["--top-p", "1.5"], ["--model", "/no/such/file.gguf"],
                                  ["--temperature", "-2"], ["-n", "0"]])
def test_nonsense_arguments_exit_2_with_one_line(args):
    r = run("generate", "x", *args)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("args,msg", [(["--temperature", "abc"], "--temperature: must be a finite number >= 0, got 'abc'"),
                                      (["--max-tokens", "1.5"], "--max-tokens: must be an integer >= 1, got '1.5'"),
                                      (["--prefill-chunk", "x"], "must be auto, none or an integer >= 1, got 'x'")])
def test_a_value_that_is_no_number_says_what_it_must_be(args, msg):
    r = run("generate", "x", *args)
    assert r.returncode == 2 and msg in r.stderr and "parse" not in r.stderr, r.stderr


def test_speculative_flags_without_a_method_are_refused_not_ignored():
    r = run("generate", "x", "--draft-len", "3", "--policy", "fixed")
    assert r.returncode == 2 and "--draft-len, --policy set without a speculative method" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_unsupported_model_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    r = run("generate", "x", "--model", str(bad))
    assert r.returncode == 2 and "bad.gguf" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_corrupt_hf_checkpoint_is_one_line(tmp_path):
    import json
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64}))
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!")
    r = run("generate", "x", "--model", str(tmp_path))
    assert r.returncode == 2 and "safetensors" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("delay", [0.1, 0.4, 1.0, 2.5])  # importing, loading torch, loading the model, generating
def test_ctrl_c_at_any_moment_exits_130_quietly(delay):
    """The installed `specserve` command (Python itself prints a traceback for a Ctrl-C in its first
    ~50 ms, before any of our code runs)."""
    import os
    import signal
    import time
    exe = os.path.join(os.path.dirname(sys.executable), "specserve")
    if not os.path.exists(exe):
        pytest.skip("the specserve command is not installed beside this interpreter")
    # as from a terminal: a background job (make test &) hands its children an ignored SIGINT, which
    # Python keeps until main() installs its handler
    p = subprocess.Popen([exe, "generate", "def f(x):", "--max-tokens", "400", "--ignore-eos"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == "", err[-500:]


def test_build_ngram_then_generate_with_it(tmp_path):
    out = tmp_path / "ngram.npz"
    r = run("build-ngram", "--out", str(out), "--corpus-tokens", "30000")
    assert r.returncode == 0, r.stderr
    assert out.exists() and "trigrams" in r.stdout
    r = run("generate", "def add(a, b):", "--max-tokens", "16", "--speculative", "ngram", "--ngram-model", str(out),
            "--no-fallback")
    assert r.returncode == 0, r.stderr
    assert "[speculative ngram:" in r.stderr


def test_show_origins_colours_the_answer_by_who_proposed_each_token():
    r = run("generate", "def add(a, b):\n    return a + b\n\ndef sub(a, b):", "--max-tokens", "24",
            "--speculative", "lookup", "--no-fallback", "--show-origins")
    assert r.returncode == 0, r.stderr
    assert "\033[32m" in r.stdout  # lookup's colour: copies of the prompt's lines were accepted
    assert "[origins:" in r.stdout and "lookup" in r.stdout.splitlines()[-1]


def test_generate_with_a_json_schema_file_a_choice_and_a_bad_regex(tmp_path):
    import json
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["colour", "count"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    r = run("generate", "Pick a colour and a count as JSON.", "--chat", "--json-schema", str(path), "--max-tokens", "40")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[0])
    assert got["colour"] in ("red", "green", "blue") and 0 <= got["count"] <= 9
    r = run("generate", "Is water wet?", "--chat", "--choice", "yes,no", "--max-tokens", "8")
    assert r.returncode == 0 and r.stdout.splitlines()[0] in ("yes", "no"), r.stdout + r.stderr
    r = run("generate", "x", "--regex", "((")
    assert r.returncode == 2 and "guided_regex" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.full  # a benchmark's whole run: `make test-all` (bench spec and plan stay in `make test`)
def test_bench_guided_writes_validity_speed_and_engines(tmp_path):
    import json
    r = run("bench", "guided", "--schemas", "2", "--samples", "1", "--speculative", "lookup", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    got = json.loads(next(tmp_path.glob("guided-*.json")).read_text())
    cfg = got["configs"]
    assert all(cfg[c]["validity"] == 1.0 for c in ("constrained", "constrained+ff", "constrained+ff+spec"))
    assert cfg["constrained+ff"]["fast_forwarded_share"] > 0.2 and cfg["constrained"]["fast_forwarded_share"] == 0
    assert got["engines"]["llguidance"]["mask_ms_per_token"] > 0
    assert list(tmp_path.glob("guided-*.md")) and list(tmp_path.glob("guided-*.png"))


@pytest.mark.full  # a benchmark's whole run: `make test-all` (bench spec and plan stay in `make test`)
def test_bench_prefix_writes_ttft_with_and_without_the_cache(tmp_path):
    import json
    r = run("bench", "prefix", "--prefix-tokens", "200", "--rounds", "2", "--shared", "1", "--max-tokens", "4",
            "--kv-cache-gib", "0.25", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    got = json.loads(next(tmp_path.glob("prefix-*.json")).read_text())
    assert got["identical_outputs"] and got["turn2_cached_tokens"] >= 192
    assert set(got["ttft_s"]["cached"]) == {"turn1_ttft", "turn2_ttft", "shared_ttft"}
    assert list(tmp_path.glob("prefix-*.md")) and list(tmp_path.glob("prefix-*.png"))


@pytest.mark.full  # a benchmark's whole run: `make test-all` (bench spec and plan stay in `make test`)
def test_bench_sarathi_writes_latencies_for_chunked_and_whole_prompt_prefill(tmp_path):
    import json
    r = run("bench", "sarathi", "--decoders", "2", "--max-tokens", "12", "--long", "1", "--long-tokens", "200",
            "--first-arrival", "0.05", "--rounds", "1", "--kv-cache-gib", "0.25", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    got = json.loads(next(tmp_path.glob("sarathi-*.json")).read_text())
    assert got["prefill_chunk"]["whole-prompt prefill"] is None and got["prefill_chunk"]["chunked (SARATHI)"] >= 16
    assert all(e["complete"] and e["itl_p99_ms"] > 0 for e in got["engines"].values())
    assert list(tmp_path.glob("sarathi-*.md")) and list(tmp_path.glob("sarathi-*.png"))


@pytest.mark.full  # a benchmark's whole run: `make test-all` (bench spec and plan stay in `make test`)
def test_bench_nbest_writes_pass_rates_within_the_budget(tmp_path):
    import json
    r = run("bench", "nbest", "--problems", "2", "--batch-sizes", "1,2", "--budget", "0.5", "--max-tokens", "64",
            "--speculative", "lookup", "--kv-cache-gib", "0.25", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    got = json.loads(next(tmp_path.glob("nbest-*.json")).read_text())
    for name in ("regular", "speculative"):
        t = got["table"][name]
        assert set(t) == {"1", "2"}
        assert all(0 <= t[b][k] <= 1 for b in t for k in ("pass_at_first", "pass_at_all", "finished_share"))
        assert all(t[b]["pass_at_first"] <= t[b]["pass_at_all"] for b in t)
        assert all(t[b]["mean_wall_s"] < 0.5 + 1.0 for b in t)  # the budget stops them (a step of slack)
    assert list(tmp_path.glob("nbest-*.md")) and list(tmp_path.glob("nbest-*.png"))


def test_plan_prints_placement_and_writes_json(tmp_path):
    import json
    out = tmp_path / "plan.json"
    r = run("plan", "--cluster", "1x2:16GB", "--models", "bert-6.7b:2", "--workload", "gamma:rate=3,cv=4",
            "--duration", "300", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "alpaserve: SLO attainment" in r.stdout
    j = json.loads(out.read_text())
    assert {"policy", "groups", "slo_attainment", "latency_p50_s", "latency_p99_s", "planning_time_s"} <= set(j)
    assert 0 <= j["slo_attainment"] <= 1 and all({"devices", "pp", "op", "models"} <= set(g) for g in j["groups"])


@pytest.mark.parametrize("args,msg", [(["--models", "S9"], "unknown model or set"),
                                      (["--cluster", "1x1:8GB", "--models", "bert-6.7b:1"], "does not fit"),
                                      (["--workload", "trace:/no/such.csv"], "cannot read trace"),
                                      (["--cluster", "lots"], "NODESxDEVICES:MEMORY"),
                                      (["--beam", "0"], "--beam: must be an integer >= 1"),
                                      (["--beam", "-3"], "--beam: must be an integer >= 1"),
                                      (["--beam", "x"], "--beam: must be an integer >= 1, got 'x'"),
                                      (["--slo-scale", "-1"], "--slo-scale: must be a finite number > 0"),
                                      (["--workload", "gamma:rate=inf"], "finite numbers > 0"),
                                      (["--workload", "gamma:rate=1e12"], "at most 100000 requests/s")])
def test_plan_bad_input_is_one_line(args, msg, capsys):
    """In this process (main(argv), as the console script calls it: a second interpreter per case cost
    6 s of imports each); the exit code and the one line on stderr of a real process are checked below."""
    from specserve.cli.main import main
    try:
        code = main(["plan", *args])
    except SystemExit as e:  # argparse's refusals exit from inside the parser
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_plan_bad_input_is_one_line_from_a_process():
    r = run("plan", "--models", "S9")
    assert r.returncode == 2 and "unknown model or set" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.full  # a benchmark's whole run: `make test-all` (bench spec and plan stay in `make test`)
def test_plan_example_and_sweep_write_figures_and_json(tmp_path):
    import json
    r = run("plan", "example", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "two-models.json").read_text())["rows"]
    assert [x["cv"] for x in rows] == [1, 2, 3, 4, 5, 6, 7, 8] and (tmp_path / "two-models.png").stat().st_size > 0
    r = run("plan", "sweep", "--models", "bert-6.7b:4", "--cluster", "2x4:16GB", "--axes", "rate,cv",
            "--requests", "300", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "| bert-6.7b:4 | rate |" in r.stdout and "| bert-6.7b:4 | cv |" in r.stdout
    sweep = json.loads(next(tmp_path.glob("sweep-bert-6.7b:4-*.json")).read_text())
    assert {row["axis"] for row in sweep["rows"]} == {"rate", "cv"} and next(tmp_path.glob("sweep-*.png"))


@pytest.mark.full  # a benchmark's whole run: `make test-all` (bench spec and plan stay in `make test`)
def test_plan_llm_compares_drafts_with_replicas(tmp_path):
    """The LLM mode on a synthetic profile (memory-bound up to 16 tokens) and a draft with alpha 0.8."""
    import json

    from specserve.planner.llm import PassProfile
    prof = tmp_path / "passes.json"
    PassProfile("embedded", [1, 16, 1024], [0.010, 0.010, 0.640], 0.1, 4.6e-5,
                {"draft": {"weights_gb": 0.008, "kv_gb_per_token": 1.5e-6}}).save(str(prof))
    bench = tmp_path / "spec.json"
    bench.write_text(json.dumps({"tables": {"greedy": [{"alpha": 0.8, "c": 0.12}]}}))
    r = run("plan", "--llm", "--llm-profile", str(prof), "--spec-bench", str(bench), "--scenarios", "conversation",
            "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "speculation-aware placement raises attainment" in r.stdout, r.stdout
    j = json.loads(next(tmp_path.glob("llm-*.json")).read_text())["scenarios"]["conversation"]
    assert j["speculation-aware"]["slo_attainment"] > j["no drafts"]["slo_attainment"]
    assert any(d["drafts"] for d in j["speculation-aware"]["devices"])
    assert json.loads(next(tmp_path.glob("llm-*.json")).read_text())["prefill_chunk"] is None  # no prefill curve
    chunked = tmp_path / "chunked"
    PassProfile("embedded", [1, 16, 1024], [0.010, 0.010, 0.640], 0.1, 4.6e-5,
                {"draft": {"weights_gb": 0.008, "kv_gb_per_token": 1.5e-6}, "prefill_chunk": 32},
                [32, 1024], [0.020, 0.640]).save(str(prof))
    r = run("plan", "--llm", "--llm-profile", str(prof), "--spec-bench", str(bench), "--scenarios", "code",
            "--out", str(chunked))
    assert r.returncode == 0, r.stderr
    assert json.loads(next(chunked.glob("llm-*.json")).read_text())["prefill_chunk"] == 32
    r = run("plan", "--llm", "--llm-profile", str(tmp_path / "none.json"))
    assert r.returncode == 2 and "specserve profile --llm" in r.stderr


@pytest.mark.parametrize("args,msg", [(["sweep", "--axes", "speed"], "unknown axes"),
                                      (["sweep", "--models", "S1,S7"], "unknown model or set 's7'"),
                                      (["replay", "--placements", "spread"], "unknown placement 'spread'"),
                                      (["replay", "--workloads", "burst:3"], "expected KIND:key=value"),
                                      (["--profile", "/no/profile.json"], "cannot read profile"),
                                      (["--llm", "--scenarios", "chat"], "unknown scenarios"),
                                      (["--memory-budget", "0"], "--memory-budget: must be")])
def test_plan_subcommands_bad_input_is_one_line(args, msg):
    r = run("plan", *args)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bench_spec_writes_tables_json_and_plot(tmp_path):
    import json
    r = run("bench", "spec", "--batch-sizes", "1,2", "--settings", "greedy", "--sequences", "2", "--min-rounds", "1",
            "--max-tokens", "12", "--no-ablations", "--no-pass-at-1", "--no-peers", "--speculative", "lookup+draft",
            "--no-shapes", "--no-tree-sizes", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    [js] = list(tmp_path.glob("spec-cpu-*.json"))
    res = json.loads(js.read_text())
    rows = res["tables"]["greedy"]
    assert [t["batch"] for t in rows] == [1, 2] and [t["rounds"] for t in rows] == [2, 1]
    assert all(t["identical_to_rd"] for t in rows)  # greedy speculative == greedy RD, token for token
    assert all(t["rd"]["all_ms"] > 0 and t["spec"]["all_ms"] > 0 for t in rows)
    assert res["hardware"]["floor_ms_per_token"] > 0
    assert list(tmp_path.glob("spec-cpu-*.md")) and list(tmp_path.glob("spec-cpu-*.png"))
    [page] = list(tmp_path.glob("spec-cpu-*-origins.html"))
    assert "HumanEval/12" in page.read_text() and 'class="o-target"' in page.read_text()


@pytest.mark.full  # a benchmark's whole run: `make test-all` (bench spec and plan stay in `make test`)
def test_bench_staged_writes_the_papers_tables(tmp_path):
    import json
    r = run("bench", "staged", "--prompts", "1", "--max-tokens", "10", "--threshold-repeats", "1", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    [js] = list(tmp_path.glob("staged-*.json"))
    res = json.loads(js.read_text())
    greedy = res["settings"]["greedy"]
    assert list(greedy) == ["regular", "speculative", "staged, 2 levels", "staged, 3 levels"]
    assert all(row["identical_to_regular"] for row in greedy.values())
    assert [s["pair"] for s in greedy["staged, 3 levels"]["stages"]] == \
        ["target <- target", "target <- target", "target <- lookup"]
    assert all(row["traffic_per_token"] > 0 for row in greedy.values())
    assert set(res["threshold"]) == {"What is a tensor in machine learning?", "Index: A B C", "The digits of Pi are 3.14159"}
    assert list(tmp_path.glob("staged-*.md")) and list(tmp_path.glob("staged-*.png"))


@pytest.mark.full  # a benchmark's whole run: `make test-all` (bench spec and plan stay in `make test`)
def test_bench_spec_shapes_part_compares_chains_trees_and_auto_beyond_code(tmp_path):
    """The draft-shape part at its smallest: every shape on both prompt sets, per-category acceptance,
    and the batch-1 tree sizes, each cell against RD (greedy: token for token)."""
    import json
    r = run("bench", "spec", "--batch-sizes", "1", "--settings", "none", "--shape-sequences", "1", "--shape-min-rounds", "1",
            "--max-tokens", "6", "--per-category", "1", "--no-forced", "--no-ablations", "--no-pass-at-1", "--no-peers",
            "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    [js] = list(tmp_path.glob("spec-cpu-*.json"))
    res = json.loads(js.read_text())
    shapes = res["drafting"]["shapes"]
    assert set(shapes) == {"humaneval", "beyond code"}
    assert all(set(configs) == {"draft chain", "draft tree", "draft auto", "lookup+draft auto"} for configs in shapes.values())
    assert all(t["identical_to_rd"] for configs in shapes.values() for rows in configs.values() for t in rows)
    assert set(res["drafting"]["categories"]["draft chain"]) == {"chat", "summarisation", "translation", "math", "qa"}
    assert all(t["identical_to_rd"] for configs in res["tree_sizes"].values() for t in configs.values())
    md = next(tmp_path.glob("spec-cpu-*.md")).read_text()
    assert "## draft shapes" in md and "## tree sizes" in md


@pytest.mark.parametrize("error, code", [(RuntimeError("boom"), 1), (KeyboardInterrupt(), 130),
                                         (ValueError("bad value"), 2)])
def test_exit_codes_one_line_and_debug(monkeypatch, capsys, error, code):
    """User errors exit 2, anything unexpected 1 with a hint to rerun with --debug, Ctrl-C 130
    quietly; --debug (anywhere on the line) shows the traceback instead."""
    from specserve.cli import main as cli

    def boom(args):
        raise error

    monkeypatch.setattr(cli, "cmd_generate", boom)
    assert cli.main(["generate", "x"]) == code
    err = capsys.readouterr().err
    assert err.count("\n") <= 1
    if code == 1:
        assert "RuntimeError: boom" in err and "--debug" in err
    if code == 130:
        assert err == ""
    if code != 130:
        with pytest.raises(type(error)):
            cli.main(["generate", "x", "--debug"])


@pytest.mark.parametrize("content, why", [(None, "No such file"), ("{", "not JSON"),
                                          ('{"models": {"a": {"model": null}}, "replicas": [{"model": "b"}]}',
                                           "replica 0 names no model")])
def test_serve_refuses_a_bad_placement_in_one_line_before_ray_starts(tmp_path, content, why):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    r = run("serve", "--placement", str(path), "--port", "0")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and str(path) in r.stderr and why in r.stderr, r.stderr


def test_serve_refuses_a_busy_or_impossible_port_in_one_line_before_loading():
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run("serve", "--port", str(port))
        assert r.returncode == 2 and f"cannot listen on http://127.0.0.1:{port}" in r.stderr, r.stderr
        assert r.stderr.strip().count("\n") == 0 and "kernels:" not in r.stderr  # no start-up line: nothing loaded
    r = run("serve", "--port", "70000")
    assert r.returncode == 2 and "port must be 0-65535" in r.stderr and r.stderr.strip().count("\n") == 0

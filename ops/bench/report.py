"""The benchmark's report: the figures put together (`build`), as Markdown (`render`) and one console paragraph.

Pure: `build` takes what the runs measured (plain dicts) and adds the summary table, the ratios, the targets
and the statements of what limits each system, each drawn from a measurement (batch cost, batch phases, CPU by
process and by JVM thread, flight-recording samples); `render` turns that dict into Markdown. Both work on a
saved `report.json`, so a report can be rendered again without running anything.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ops.bench import analysis, eventlog

PIPELINE, BASELINE = "pipeline", "baseline"


def is_pipeline(name: str) -> bool:
    """The pipeline or a variant of it (`pipeline-LABEL`, `python -m ops.bench --variant`)."""
    return name == PIPELINE or name.startswith(f"{PIPELINE}-")


def build(
    *,
    kind: str,
    command: str,
    started: float,
    finished: float,
    settings: Mapping[str, Any],
    traffic: Mapping[str, Any],
    ceiling: Mapping[str, Any],
    systems: Mapping[str, Any],
    machine: Mapping[str, Any],
) -> dict[str, Any]:
    """The whole report as one JSON-ready dict."""
    data: dict[str, Any] = {
        "kind": kind,
        "command": command,
        "started": _iso(started),
        "finished": _iso(finished),
        "minutes": round((finished - started) / 60, 1),
        "machine": dict(machine),
        "settings": dict(settings),
        "traffic": dict(traffic),
        "ceiling": dict(ceiling),
        "systems": dict(systems),
    }
    return derive(data)


def derive(data: dict[str, Any]) -> dict[str, Any]:
    """Add to a report's measurements (or a saved `report.json`) what follows from them: the summary, the ratios,
    the targets, what limits each system and the soak's verdict."""
    kind, systems = data["kind"], data["systems"]
    data["summary"] = summary_rows(data)
    data["ratios"] = ratios(data)
    pipeline = systems.get(PIPELINE)
    if pipeline is not None and kind == "bench":
        knee = pipeline["knee"]
        baseline = systems.get(BASELINE)
        knee_figures = knee_step(pipeline) or {}
        data["targets"] = analysis.targets(
            analysis.TargetFigures(
                pipeline_rate=knee["sustained_rate"],
                baseline_rate=baseline["knee"]["sustained_rate"] if baseline else None,
                baseline_held_every_rate=bool(data["ratios"].get("baseline_kept_up_at_every_rate")),
                baseline_held_a_rate_the_pipeline_did_not=_held_where_pipeline_failed(baseline, knee["first_failed"]),
                p99_ms=p99_at(pipeline, analysis.LATENCY_RATE),
                baseline_p99_ms=p99_at(baseline, analysis.LATENCY_RATE) if baseline else None,
                burst_rate=_burst_rate(pipeline),
                baseline_burst_rate=_burst_rate(baseline) if baseline else None,
                cpu_us_per_event=knee_figures.get("cpu_us_per_event"),
            )
        )
    data["limits"] = {name: limits(result, data["machine"].get("cores") or 2) for name, result in systems.items()}
    if kind == "soak" and pipeline is not None:
        data["soak"] = soak_verdict(pipeline)
    return data


def _held_where_pipeline_failed(baseline: Mapping[str, Any] | None, failed_rate: int | None) -> bool:
    """Whether the baseline kept up at the offered rate where the pipeline first did not."""
    if baseline is None or failed_rate is None:
        return False
    return any(s["offered_rate"] == failed_rate and analysis.keeps_up(s) for s in baseline.get("steps") or [])


def _iso(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


def knee_step(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The step a system's headline figures come from: the highest it kept up at, else its best."""
    steps = result.get("steps") or []
    held = [s for s in steps if analysis.keeps_up(s)]
    if held:
        return dict(held[-1])
    return dict(max(steps, key=lambda s: s["sustained_rate"])) if steps else None


def p99_at(result: Mapping[str, Any], rate: int) -> int | None:
    """A system's p99 latency in ms at the step offered `rate`, if it ran that step and kept up."""
    for step in result.get("steps") or []:
        if step["offered_rate"] == rate and analysis.keeps_up(step):
            return int(step["latency_ms"]["p99"])
    return None


def limit_step(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The step that shows what limits a system: the one past the knee (`analysis.knee`: not a first step lost
    to the cold start when a higher rate was held), else its last."""
    steps = result.get("steps") or []
    if not steps:
        return None
    failed = analysis.knee(steps)["first_failed"]
    return dict(next((s for s in steps if s["offered_rate"] == failed), steps[-1]))


def summary_rows(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per thing measured: the ceilings, then each system at its knee."""
    rows = []
    ceiling = data.get("ceiling") or {}
    labels = {
        "write_preserialized": "write: pre-serialized frames, one Python producer",
        "write_simulator": "write: `adbill produce` (simulating as it sends)",
        "read_kafka_tool": "read: Kafka's ConsumerPerformance (Java)",
        "read_python": "read: a plain confluent-kafka consumer (Python)",
    }
    for key, label in labels.items():
        if key in ceiling:
            figures = ceiling[key]
            cpu = figures.get("cpu_s")
            seconds = figures.get("seconds") or _span(figures)
            rows.append(
                {
                    "what": f"ceiling, {label}",
                    "sustained_rate": figures["rate"],
                    "cpu_cores": round(cpu / seconds, 2) if cpu and seconds else None,
                }
            )
    for name, result in (data.get("systems") or {}).items():
        step = knee_step(result)
        burst = result.get("burst") or {}
        phases = [result.get("catch_up") or {}, *(result.get("steps") or []), burst]
        checks = [p["ledger_check"] for p in phases if p.get("ledger_check") is not None]
        rows.append(
            {
                "what": name,
                "sustained_rate": result["knee"]["sustained_rate"],
                "kept_up_to": result["knee"]["kept_up_to"],
                "first_failed": result["knee"]["first_failed"],
                "burst_rate": burst.get("rate") if burst.get("drained") else None,
                "latency_ms": step["latency_ms"] if step else None,
                "cpu_cores": step["job_cpu_cores"] if step else None,
                "cpu_us_per_event": step.get("cpu_us_per_event") if step else None,
                "peak_rss_mb": result.get("peak_rss_mb"),
                "state_rows": step["state_rows_max"] if step else None,
                "ledger_exact": all(c["equal"] for c in checks) if checks else None,
                "overrides": result.get("overrides") or {},
            }
        )
    return rows


def _span(figures: Mapping[str, Any]) -> float | None:
    if "first_send" in figures and "last_send" in figures:
        return float(figures["last_send"] - figures["first_send"])
    return None


def read_ceiling(data: Mapping[str, Any]) -> int | None:
    """The rate the raw events can be read back at: the faster of Kafka's tool and the Python consumer."""
    ceiling = data.get("ceiling") or {}
    rates = [ceiling[k]["rate"] for k in ("read_kafka_tool", "read_python") if k in ceiling]
    return max(rates) if rates else None


def ratios(data: Mapping[str, Any]) -> dict[str, Any]:
    """pipeline / read ceiling and pipeline / baseline, sustained at the knee and reading a burst."""
    systems = data.get("systems") or {}
    read = read_ceiling(data)
    pipeline, baseline = systems.get(PIPELINE), systems.get(BASELINE)
    out: dict[str, Any] = {}
    if pipeline is None:
        return out
    rate = pipeline["knee"]["sustained_rate"]
    burst = _burst_rate(pipeline)
    out["pipeline_over_read_ceiling"] = analysis.ratio(rate, read)
    out["pipeline_over_read_ceiling_burst"] = analysis.ratio(burst, read)
    if baseline is not None:
        out["pipeline_over_baseline"] = analysis.ratio(rate, baseline["knee"]["sustained_rate"])
        out["baseline_kept_up_at_every_rate"] = baseline["knee"]["first_failed"] is None
        out["pipeline_over_baseline_burst"] = analysis.ratio(burst, _burst_rate(baseline))
    return out


def _burst_rate(result: Mapping[str, Any]) -> int | None:
    burst = result.get("burst") or {}
    return burst.get("rate") if burst.get("drained") else None


def limits(result: Mapping[str, Any], cores: int) -> list[str]:
    """Statements of what limits a system, each from a measurement (module doc)."""
    out = []
    batches = [b | {"batch_duration_ms": b["duration_ms"]} for b in result.get("batches") or []]
    cost = analysis.batch_cost(batches)
    if cost["fixed_ms"] is not None and cost["capacity"]:
        out.append(
            f"Batch cost (least squares over {cost['batches']} batches that read records): a fixed "
            f"{cost['fixed_ms'] / 1000:.1f} s per batch plus {cost['per_event_us']} µs per event; the fastest batch "
            f"took {cost['min_ms'] / 1000:.1f} s. So latency cannot go much below the fixed part, and the "
            f"per-event part alone caps the throughput at {cost['capacity']:,} events/s."
        )
    elif cost["fixed_ms"] is not None:
        out.append(
            f"Batch cost: over {cost['batches']} batches that read records, the duration did not grow with the "
            f"batch's size (the fastest took {cost['min_ms'] / 1000:.1f} s): the fixed part per batch dominates."
        )
    step = limit_step(result)
    if step is None:
        return out
    rate = f"{step['offered_rate']:,} events/s offered"
    phases = step.get("phase_ms_mean") or {}
    shown = [(k, v) for k, v in phases.items() if k != "triggerExecution"][:4]
    if shown:
        parts = ", ".join(f"{k} {v / 1000:.2f} s" for k, v in shown)
        out.append(
            f"At {rate}, a batch took {phases.get('triggerExecution', 0) / 1000:.2f} s on average ({parts}; "
            "Spark's own phase timings)."
        )
    machine = step.get("machine_cpu_cores") or 0.0
    ours = {
        "the job": step.get("job_cpu_cores") or 0.0,
        "Kafka": step.get("kafka_cpu_cores") or 0.0,
        "Redis": step.get("redis_cpu_cores") or 0.0,
        "the sender": step.get("sender_cpu_cores") or 0.0,
    }
    others = max(0.0, machine - sum(ours.values()))
    split = ", ".join(f"{k} {v:.2f}" for k, v in ours.items())
    by_process = ", ".join(f"{k} {v:.2f}" for k, v in (step.get("job_cpu_by_process") or {}).items())
    bound = "CPU-bound" if machine >= 0.9 * cores else "not CPU-bound"
    out.append(
        f"At {rate}, the machine was busy {machine:.2f} of {cores} cores ({bound}): {split}, other programs "
        f"{others:.2f}. The job's cores by process: {by_process or '-'}."
    )
    threads = list((step.get("jvm_threads_cores") or {}).items())[:6]
    if threads:
        out.append(
            "JVM threads by CPU (from /proc, native code included): "
            + ", ".join(f"{name} {cores_:.2f}" for name, cores_ in threads)
            + "."
        )
    recording = step.get("profile")
    if recording and recording.get("samples"):
        charged = ", ".join(f"{a['name']} {a['share']:.0%}" for a in recording["by_area"][:6])
        out.append(f"Flight recording at {rate} ({recording['samples']:,} samples of Java code): {charged}.")
        stream = recording.get("stream_thread") or {}
        if stream.get("samples"):
            phases = ", ".join(f"{p['name']} {p['share']:.0%}" for p in stream["phases"])
            out.append(f"The driver's stream thread ({stream['samples']:,} samples): {phases}.")
    return out


def soak_verdict(pipeline: Mapping[str, Any]) -> dict[str, Any]:
    """Whether memory, state and latency stay flat over the soak (`analysis.flatness` on the last 2/3)."""
    step = (pipeline.get("steps") or [{}])[0]
    sender = step.get("sender") or {}
    start = sender.get("first_send", 0.0) - pipeline.get("launched", 0.0)
    end = sender.get("last_send", 0.0) - pipeline.get("launched", 0.0)
    memory = [(t, mb) for t, mb in pipeline.get("memory") or [] if start <= t <= end]
    batches = [b for b in pipeline.get("batches") or [] if b["input_rows"] > 0]
    launched_ms = pipeline.get("launched", 0.0) * 1000
    state = [((b["end_ms"] - launched_ms) / 1000, b["state_rows"]) for b in batches]
    # Whole minutes of the send window only: the last ones drain what was left.
    minutes = [m for m in step.get("latency_by_minute") or [] if (m["minute"] + 1) * 60 <= end - start]
    by_process = {
        f"memory:{command}": analysis.flatness([t for t, _ in inside], [m for _, m in inside], tolerance=0.10, floor=50)
        for command, points in sorted((pipeline.get("memory_by_process") or {}).items())
        # The job's own processes, not the short-lived children they run now and then (chmod, rm).
        if len(inside := [(t, mb) for t, mb in points if start <= t <= end]) >= 0.9 * len(memory) >= 2
    }
    return {
        **by_process,
        "memory": analysis.flatness([t for t, _ in memory], [m for _, m in memory], tolerance=0.10, floor=50),
        "state_rows": analysis.flatness([t for t, _ in state], [s for _, s in state], tolerance=0.10, floor=1_000),
        "p99_latency": analysis.flatness(
            [m["minute"] * 60 for m in minutes], [m["p99"] for m in minutes], tolerance=0.25, floor=500
        ),
    }


def ledgers_exact(data: Mapping[str, Any]) -> bool:
    """True unless a ledger check found a difference."""
    for result in (data.get("systems") or {}).values():
        for step in result.get("steps") or []:
            check = step.get("ledger_check")
            if check is not None and not check["equal"]:
                return False
    return True


def _rate(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def _latency(lat: Mapping[str, int] | None) -> str:
    if not lat or not lat.get("count", 1):
        return "-"
    return f"{lat['p50'] / 1000:.1f} / {lat['p99'] / 1000:.1f} / {lat['max'] / 1000:.1f}"


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "**no**")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join("-" if c is None else str(c) for c in row) + " |" for row in rows]
    return lines


def render(data: Mapping[str, Any], images: Sequence[tuple[str, str]] = ()) -> str:
    """The report as Markdown; `images` are (title, file name) of the plots beside it."""
    out = [f"# adbill {'soak test' if data['kind'] == 'soak' else 'benchmark'}, {data['started']}", ""]
    machine = data.get("machine") or {}
    out += [
        f"Command: `{data['command']}` ({data['minutes']} minutes). Machine: {machine.get('cores')} cores, "
        f"{machine.get('memory_gb')} GB, shared with other work: busy {machine.get('busy_cores_mean')} cores on "
        f"average over the run, load average {machine.get('load_average_at_end')} at the end.",
        "",
        _settings_line(data.get("settings") or {}),
        "",
    ]
    if data["kind"] == "soak":
        out += _render_soak(data)
    else:
        out += _render_bench(data)
    if images:
        out += ["## Plots", ""]
        out += [f"![{title}]({name})" for title, name in images]
        out.append("")
    out += _render_limits(data)
    out += _render_batch_time(data)
    out += _render_method(data)
    return "\n".join(out) + "\n"


def _settings_line(settings: Mapping[str, Any]) -> str:
    if not settings:
        return ""
    return (
        f"Spark `{settings.get('spark_master')}`, {settings.get('shuffle_partitions')} shuffle partitions, "
        f"trigger {settings.get('trigger_ms')} ms, at most {_rate(settings.get('max_offsets_per_trigger'))} "
        f"records per topic per batch, state store {settings.get('state_store')}, join state format "
        f"{settings.get('join_state_format', 'default')}, driver memory "
        f"{settings.get('driver_memory')}, watermarks {settings.get('impression_watermark_ms')} / "
        f"{settings.get('click_watermark_ms')} ms, {settings.get('topic_partitions')} partitions per topic."
    )


def _render_bench(data: Mapping[str, Any]) -> list[str]:
    out = ["## Summary", ""]
    rows = []
    for row in data.get("summary") or []:
        if row["what"].startswith("ceiling"):
            rows.append([row["what"], _rate(row["sustained_rate"]), "-", "-", "-", row.get("cpu_cores"), "-", "-", "-"])
            continue
        held = row.get("kept_up_to")
        knee = f"kept up to {held:,}/s" if held else "kept up at no rate tried"
        if row.get("first_failed"):
            knee += f", not at {row['first_failed']:,}/s"
        if row.get("overrides"):
            knee = ", ".join(f"`{k}={v}`" for k, v in row["overrides"].items()) + "; " + knee
        rows.append(
            [
                f"**{row['what']}** ({knee})",
                f"**{_rate(row['sustained_rate'])}**",
                _rate(row.get("burst_rate")),
                _latency(row.get("latency_ms")),
                _rate(row.get("state_rows")),
                row.get("cpu_cores"),
                "-" if row.get("cpu_us_per_event") is None else f"{row['cpu_us_per_event']:.1f}",
                _rate(row.get("peak_rss_mb")),
                _yes(row.get("ledger_exact")) if is_pipeline(row["what"]) else "n/a (no sink)",
            ]
        )
    out += _table(
        [
            "what",
            "sustained events/s",
            "burst events/s",
            "latency p50 / p99 / max (s)",
            "state rows",
            "CPU cores",
            "CPU us/event",
            "peak RSS MB",
            "ledger = truth",
        ],
        rows,
    )
    out.append("")
    ratio = data.get("ratios") or {}
    if ratio:
        out += ["## Ratios", ""]
        names = {
            "pipeline_over_read_ceiling": "pipeline / read ceiling (sustained at the knee; the faster reader)",
            "pipeline_over_read_ceiling_burst": "pipeline / read ceiling (reading the burst)",
            "pipeline_over_baseline": "pipeline / baseline (sustained at the knee)",
            "pipeline_over_baseline_burst": "pipeline / baseline (reading the same burst)",
        }
        out += _table(["ratio", "value"], [[label, ratio.get(key)] for key, label in names.items() if key in ratio])
        if ratio.get("baseline_kept_up_at_every_rate"):
            out += [
                "",
                "The baseline kept up at every rate tried, so what it sustained is a lower bound of what it holds "
                "and the ratio at the knee an upper bound. The burst ratio compares both reading the same 'sudden "
                "backlog' as fast as they can, warm: batches then hit `maxOffsetsPerTrigger` and the state holds "
                "the whole burst, a harder regime than the steps.",
            ]
        out.append("")
    if data.get("targets"):
        out += ["## Targets (2-core machine)", ""]
        out += _table(
            ["target", "measured", "met"], [[t["target"], t["measured"], _yes(t["met"])] for t in data["targets"]]
        )
        out.append("")
    for name, result in (data.get("systems") or {}).items():
        out += _render_steps(name, result)
    return out


def _render_steps(name: str, result: Mapping[str, Any]) -> list[str]:
    out = [f"## {name}: `{result.get('command')}`", ""]
    if result.get("error"):
        out += ["The run ended early:", "", "```", str(result["error"]), "```", ""]
    if result.get("startup_s") is not None:
        out += [f"Started in {result['startup_s']} s (to the end of its first micro-batch).", ""]
    for key, what in (
        ("catch_up", "Caught up on the backlog it started on, from a cold start (the JVM still compiling)"),
        ("burst", "Read the burst sent at once after the steps, warm"),
    ):
        phase = result.get(key)
        if not phase:
            continue
        if phase.get("drained"):
            out.append(
                f"{what}: {phase['records']:,} events in {phase['seconds']} s, **{phase['rate']:,} events/s**, "
                f"{phase['batches']} batch{'es' if phase['batches'] != 1 else ''} of {phase['batch_rows_mean']:,} "
                "events taking "
                f"{phase['batch_duration_ms_mean'] / 1000:.1f} s on average; {phase['cpu_cores']} cores "
                f"(machine {phase.get('machine_cpu_cores', '-')}), peak {phase['peak_rss_mb']:,} MB; ledger "
                + _check_text(phase.get("ledger_check"))
                + "."
            )
        else:
            out.append(f"{what}: did not read all {phase['records']:,} events in time (about {phase['rate']:,}/s).")
        out.append("")
    rows = []
    for s in result.get("steps") or []:
        check = s.get("ledger_check")
        rows.append(
            [
                _rate(s["offered_rate"]),
                _rate(s["offered_rate_achieved"]),
                f"**{_rate(s['sustained_rate'])}**",
                _rate(s.get("end_to_end_rate")),
                _latency(s["latency_ms"]),
                f"{s['batch_duration_ms_mean'] / 1000:.1f} s x {_rate(s['batch_rows_mean'])}",
                "-" if s.get("drain_s") is None else f"{s['drain_s']} s",
                s["job_cpu_cores"],
                "-" if s.get("cpu_us_per_event") is None else f"{s['cpu_us_per_event']:.1f}",
                s.get("sender_cpu_cores"),
                s["machine_cpu_cores"],
                _rate(s["job_peak_rss_mb"]),
                _rate(s["state_rows_max"]),
                "yes" if analysis.keeps_up(s) else "**no**",
                _check_text(check),
            ]
        )
    out += _table(
        [
            "offered/s",
            "sent/s",
            "sustained/s",
            "end-to-end/s",
            "p50 / p99 / max (s)",
            "batch",
            "drain",
            "job cores",
            "job CPU us/event",
            "sender cores",
            "machine cores",
            "job MB",
            "state rows",
            "kept up",
            "ledger",
        ],
        rows,
    )
    out.append("")
    return out


def _check_text(check: Mapping[str, Any] | None) -> str:
    if check is None:
        return "n/a"
    if not check["equal"]:
        return _differs(check)
    ordered = check.get("order_dependent") or 0
    tail = f"; {ordered:,} order-dependent decision(s) left to reconciliation" if ordered else ""
    return f"exact ({check['billed']:,} clicks{tail})"


def _differs(check: Mapping[str, Any]) -> str:
    return (
        f"**differs**: {check['missing']} missing, {check['extra']} extra, {check['wrong_amount']} wrong amounts, "
        f"{check['billed_twice']} twice (e.g. {', '.join(check['examples'][:3])})"
    )


def _render_soak(data: Mapping[str, Any]) -> list[str]:
    pipeline = (data.get("systems") or {}).get(PIPELINE) or {}
    traffic = data.get("traffic") or {}
    out = ["## Soak", ""]
    step = (pipeline.get("steps") or [None])[0]
    if step is None:
        return out + ["No traffic was sent.", ""]
    check = step.get("ledger_check")
    out.append(
        f"{traffic.get('cycles')} cycles of a one-minute template at {step['offered_rate']:,} events/s offered "
        f"({step['events_sent']:,} events, sent at {step['offered_rate_achieved']:,}/s): sustained "
        f"**{step['sustained_rate']:,} events/s**, latency p50 / p99 / max {_latency(step['latency_ms'])} s, "
        f"job {step['job_cpu_cores']} cores, peak {step['job_peak_rss_mb']} MB; ledger "
        + ("n/a" if check is None else ("equal to the ground truth" if check["equal"] else _differs(check)))
        + "."
    )
    out.append("")
    verdict = data.get("soak") or {}
    rows = []
    labels = {"memory": "resident memory (MB)", "state_rows": "state rows", "p99_latency": "p99 latency (ms)"}
    for key in sorted(k for k in verdict if k.startswith("memory:")):
        labels[key] = f"resident memory of {key.split(':', 1)[1]} (MB)"
    for key, label in labels.items():
        v = verdict.get(key)
        if v:
            rows.append(
                [label, _yes(v["flat"]), f"{v['slope_per_min']:,.1f}", f"{v['change_fraction']:.1%}", v["points"]]
            )
    out += _table(["over the last 2/3", "flat", "slope per minute", "change over the window", "points"], rows)
    out += ["", "Per minute:", ""]
    out += _table(
        ["minute", "clicks billed", "p50 (s)", "p99 (s)", "max (s)"],
        [
            [
                m["minute"],
                _rate(m["count"]),
                f"{m['p50'] / 1000:.1f}",
                f"{m['p99'] / 1000:.1f}",
                f"{m['max'] / 1000:.1f}",
            ]
            for m in step.get("latency_by_minute") or []
        ],
    )
    out.append("")
    return out


def _render_limits(data: Mapping[str, Any]) -> list[str]:
    out = ["## What limits each system (measured)", ""]
    for name, statements in (data.get("limits") or {}).items():
        if statements:
            out.append(f"**{name}**")
            out.append("")
            out += [f"- {s}" for s in statements]
            out.append("")
    for name, result in (data.get("systems") or {}).items():
        step = limit_step(result)
        recording = (step or {}).get("profile")
        if not recording or not recording.get("samples"):
            continue
        out += [f"### Where the CPU goes in the {name} JVM at {step['offered_rate']:,} events/s (flight recording)", ""]  # type: ignore[index]
        inclusive = {a["name"]: a["share"] for a in recording["inclusive_by_area"]}
        out += _table(
            ["area", "share of samples", "anywhere in the stack"],
            [
                [a["name"], f"{a['share']:.1%}", f"{inclusive[a['name']]:.1%}" if a["name"] in inclusive else "-"]
                for a in recording["by_area"][:12]
            ],
        )
        out.append("")
        out += _table(
            ["hottest methods (top frame)", "share"],
            [[f"`{m['name']}`", f"{m['share']:.1%}"] for m in recording["top_methods"][:10]],
        )
        out.append("")
        out += _table(["thread", "share"], [[t["name"], f"{t['share']:.1%}"] for t in recording["threads"][:6]])
        out += ["", f"Recording: `{recording['file']}`.", ""]
    return out


def _render_batch_time(data: Mapping[str, Any]) -> list[str]:
    found = data.get("batch_time") or {}
    if not found:
        return []
    out = ["## Where a batch's time goes (Spark's event log)", "", eventlog.INTRO, ""]
    for name, steps in found.items():
        out += eventlog.render(name, steps, heading="###")
    return out


def _render_method(data: Mapping[str, Any]) -> list[str]:
    traffic = data.get("traffic") or {}
    ceiling = data.get("ceiling") or {}
    out = ["## How it was measured", ""]
    out.append(
        "- Traffic: the simulator's runs (click-through 10 %, 5 % out of order within 2 s, 1 % duplicates, 0.2 % bad "
        "records, no late events), generated and serialized before the timed window "
        f"({traffic.get('prepared_in_s')} s this time, cached in `{traffic.get('cache')}`); a separate sender process "
        "only calls `produce()` at the offered rate. Its CPU is the *sender cores* column."
    )
    if "write_simulator" in ceiling:
        sim, pre = ceiling["write_simulator"], ceiling.get("write_preserialized") or {}
        top = max(traffic.get("rates") or [0])
        out.append(
            f"- What producing costs: simulating while sending (`adbill produce`) reaches {sim['rate']:,} events/s on "
            f"one core; sending pre-serialized frames reaches {pre.get('rate', 0):,}/s. At {top:,} events/s the "
            f"simulator alone would take {top / max(1, sim['rate']):.2f} cores of this machine, the sender "
            "the *sender cores* below; that is why the runs are made beforehand."
        )
    out += [
        "- Sustained: the slope of records read over the last 2/3 of each step's send window (what the job keeps "
        "up with, or its capacity when it falls behind); end-to-end: events over the time from the first send to "
        "the batch that read the last one. A step keeps up when sustained >= 90 % of the rate sent, everything "
        "was read within the drain timeout and p99 <= 30 s; the rates stop rising after the first that does not, "
        "except the first step (right after the cold start): after it the next rate is tried too.",
        "- Latency: per billable click, from its Kafka timestamp to the end of the micro-batch that billed it "
        "(pipeline: the ledger's batch id; baseline: the batch whose offsets cover the click).",
        "- CPU and memory: /proc, every second, of each process tree (the job: its Python driver and JVM); machine "
        "cores include other programs on this shared machine. State rows: the health records (all operators).",
        "- Ledger = truth: the ledger's rows of each run equal the simulator's ground truth (same clicks, once each, "
        "same amounts).",
        "",
    ]
    return out


def console_summary(data: Mapping[str, Any]) -> str:
    """A few lines for the terminal."""
    lines = []
    for row in data.get("summary") or []:
        lat = row.get("latency_ms")
        text = f"{row['what']}: {_rate(row['sustained_rate'])} events/s"
        if lat:
            text += f", p50/p99/max {_latency(lat)} s"
        if row.get("burst_rate"):
            text += f", burst {_rate(row['burst_rate'])}/s"
        if row.get("ledger_exact") is not None:
            text += f", ledger exact: {row['ledger_exact']}"
        lines.append(text)
    for name, result in (data.get("systems") or {}).items():
        if result.get("error"):
            lines.append(f"{name} ended early: {str(result['error']).splitlines()[0]}")
    for key, value in (data.get("ratios") or {}).items():
        lines.append(f"{key}: {value}")
    if data.get("kind") == "soak":
        for key, value in (data.get("soak") or {}).items():
            lines.append(f"{key} flat: {value['flat']} ({value['change_fraction']:.1%} over the last 2/3)")
    return "\n".join(lines)


def cluster_rows(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per worker count of a cluster run (`python -m ops.bench --cluster-workers`), at the knee: the
    rate, the burst, and the CPU per event of the driver (the job's own processes) and of the executors (the
    workers' process trees)."""
    rows = []
    for workers, result in (data.get("workers") or {}).items():
        step = knee_step(result) or {}
        burst = result.get("burst") or {}
        phases = [result.get("catch_up") or {}, *(result.get("steps") or []), burst]
        checks = [p["ledger_check"] for p in phases if p.get("ledger_check") is not None]
        trees = step.get("cpu_cores_by_tree") or {}
        executor_cores = round(sum(v for k, v in trees.items() if k.startswith("spark-worker")), 2)
        rows.append(
            {
                "workers": int(workers),
                "sustained_rate": result["knee"]["sustained_rate"],
                "kept_up_to": result["knee"]["kept_up_to"],
                "first_failed": result["knee"]["first_failed"],
                "burst_rate": burst.get("rate") if burst.get("drained") else None,
                "latency_ms": step.get("latency_ms"),
                "driver_cores": step.get("job_cpu_cores"),
                "driver_us_per_event": step.get("cpu_us_per_event"),
                "executor_cores": executor_cores,
                "executor_us_per_event": round(executor_cores * step["cpu_window_s"] * 1e6 / step["events_sent"], 1)
                if step.get("events_sent") and step.get("cpu_window_s")
                else None,
                "driver_by_process": step.get("job_cpu_by_process"),
                "error": result.get("error"),
                "ledger_exact": all(c["equal"] for c in checks) if checks else None,
            }
        )
    return rows


def render_cluster(data: Mapping[str, Any]) -> str:
    """report.md of a cluster run."""
    s = data.get("settings") or {}
    out = [
        "# Pipeline on a local Spark standalone cluster",
        "",
        f"`{data['command']}`, {_iso(data['started'])} to {_iso(data['finished'])}, {data['machine']['cores']} cores.",
        f"Workers of {s.get('worker_cores')} core(s) each; {s.get('shuffle_partitions')} shuffle partitions, "
        f"trigger {s.get('trigger_ms')} ms, {s.get('topic_partitions')} partitions per topic.",
        "",
    ]
    rows = [
        [
            r["workers"],
            f"**{_rate(r['sustained_rate'])}**" + (f" (not {r['first_failed']:,})" if r["first_failed"] else ""),
            _rate(r["burst_rate"]),
            _latency(r["latency_ms"]),
            r["driver_cores"],
            r["driver_us_per_event"],
            r["executor_cores"],
            r["executor_us_per_event"],
            _yes(r["ledger_exact"]),
        ]
        for r in data.get("scaling") or []
    ]
    out += _table(
        [
            "workers",
            "sustained events/s at the knee",
            "burst events/s",
            "p50 / p99 / max (s)",
            "driver cores",
            "driver CPU us/event",
            "executor cores",
            "executor CPU us/event",
            "ledger = truth",
        ],
        rows,
    )
    out.append("")
    for r in data.get("scaling") or []:
        if r.get("error"):
            out += [f"{r['workers']} worker(s) ended early:", "", "```", str(r["error"]), "```", ""]
        if r.get("driver_by_process"):
            parts = ", ".join(f"{k} {v}" for k, v in r["driver_by_process"].items())
            out.append(f"- {r['workers']} worker(s), the driver's cores by process at the knee: {parts}")
    out.append("")
    return "\n".join(out)

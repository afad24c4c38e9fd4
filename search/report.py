"""``hpsearch report``: one self-contained HTML page a person can read, PNGs beside it.

    EXP_DIR/report/report.html    the page; its images are embedded, so it can be mailed
    EXP_DIR/report/*.png          the same plots as files, for slides and papers

Plots are drawn by matplotlib, the parameter plots by Optuna's own visualization
module (``optuna.visualization.matplotlib``). Those Optuna plots use only COMPLETE
trials, and under ASHA most trials are pruned; so they are drawn from a copy of the
study in which every scored trial counts with the best value it reached, and the page
says so.
"""

from __future__ import annotations

import base64
import html
import math
import time
import warnings
from pathlib import Path
from typing import Any

from .errors import counted, resume_command
from .experiment import ExperimentDir
from .outcome import best_of
from .study_summary import StudySummary, summarize

SPEED_COLUMNS = (("trial", "trial"), ("state", "state"), ("epochs", "epochs"), ("samples_per_s", "samples/s"),
                 ("epoch_time_s", "epoch s"), ("startup_s", "start-up s"), ("data_wait_s", "data wait s"),
                 ("compute_s", "compute s"), ("precision", "precision"), ("strategy", "strategy"),
                 ("world_size", "world size"), ("device", "device"), ("num_workers", "loader workers"),
                 ("data_starved", "data-starved"))
SPEED_ROWS = 100  # trials up to which the speed table lists every one
SLOWEST_SHOWN = 20  # beyond, the slowest per epoch it lists (with the data-starved ones and the best)
LABELLED_CURVES = 30  # trials in a learning-curve plot up to which every curve is named
NAMED_BEST = 10  # beyond that, the best COMPLETE trials named
NAMES_PER_LABEL = 5  # trial numbers a shared label lists before "+N"
LABEL_HEIGHT = 0.03  # a curve label's height, as a share of the plot's value range
STATE_STYLE = {"COMPLETE": ("tab:blue", "-"), "PRUNED": ("tab:gray", "--"), "FAILED": ("tab:red", ":"),
               "RUNNING": ("tab:green", "-"), "PAUSED": ("tab:purple", "-.")}


def write_report(exp: ExperimentDir, out_dir: Path | None = None) -> Path:
    """Write the report and its PNGs; returns the HTML file's path."""
    import matplotlib

    matplotlib.use("Agg")
    out = out_dir or exp.root / "report"
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(exp)
    study = _open_study(exp, summary)
    scored = _scored_copy(study, summary)  # once for both of Optuna's plots (it was built for each)
    ranked = _ranked_parameters(scored)
    axes = ranked[:PARALLEL_AXES] if len(ranked) > PARALLEL_AXES else None
    figures = {
        "history": _history_plot(summary),
        "learning_curves": _learning_curves(study, summary),
        "parallel_coordinates": _optuna_plot("plot_parallel_coordinate", scored, summary, params=axes),
        "param_importances": _optuna_plot("plot_param_importances", scored, summary, importances=True,
                                          height=max(4.5, 1.2 + 0.3 * len(ranked))),
        "rungs": _rungs_plot(summary),
        "compute": _compute_plot(summary),
    }
    images = {}
    for name, figure in figures.items():
        if figure is None:
            continue
        path = out / f"{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        import matplotlib.pyplot as plt

        plt.close(figure)
        images[name] = path
    page = out / "report.html"
    page.write_text(_html(summary, images, parallel_of=(len(axes), len(ranked)) if axes else None),
                    encoding="utf-8")
    return page


def _shown_name(summary: StudySummary) -> str:
    """The study's directory's name: a study run again from the same file gets a dated
    one, and two mailed reports of the two had the same title (audit 39)."""
    return Path(summary.experiment_dir).name or summary.name


def _open_study(exp: ExperimentDir, summary: StudySummary):
    """The study, read as it is: a report may run beside the search that writes it."""
    from .searcher import STUDY_FILE, existing_study

    try:
        return existing_study(exp.root, summary.name, repair=False)
    except ValueError as exc:  # json's errors among them: a line edited into something else
        from .errors import ExperimentError

        raise ExperimentError(f"{exp.root / STUDY_FILE} cannot be read ({type(exc).__name__}: {exc}); a line of it "
                              "was damaged or edited (a torn last line, as a crash leaves, is skipped)") from None


def _learning_curves(study, summary: StudySummary):
    """The search metric per epoch, one line per trial, named by its trial number at its
    end; pruned trials end in an ``x`` at the rung where ASHA cut them; the rungs are the
    dotted verticals. Beyond ``LABELLED_CURVES`` trials only the ``NAMED_BEST`` best
    COMPLETE ones are named, and trials whose curves end at one point share one label
    ("3, 7"), so the names stay readable: naming every COMPLETE trial made one label of
    hundreds of numbers at 500 trials, and the figure, saved tight around it, 6,762 px wide
    (39,179 at 3,000) and unreadable in the page (audit 20, D2)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    states = {int(r["trial"]): r.get("state", "") for r in summary.rows}
    figure, axes = plt.subplots(figsize=(8, 4.5))
    curves = [(trial.number, sorted(trial.intermediate_values.items()))
              for trial in (study.trials if study is not None else []) if trial.intermediate_values]
    # best first: COMPLETE trials by their best value, then the others
    ranked = sorted(curves, key=lambda c: (states.get(c[0]) != "COMPLETE", _rank_key(c[1], summary.mode), c[0]))
    rank = {number: place for place, (number, _) in enumerate(ranked)}
    named = {number for number, _ in curves}
    if len(curves) > LABELLED_CURVES:
        named = {number for number, _ in ranked[:NAMED_BEST] if states.get(number) == "COMPLETE"}
    best = (summary.best or {}).get("trial")
    ends = []
    for number, curve in curves:
        state = states.get(number, "")
        color, style = STATE_STYLE.get(state, ("black", "-"))
        epochs, values = zip(*curve)
        axes.plot(epochs, values, linestyle=style, color=color, alpha=0.8, linewidth=2.4 if number == best else 1.2)
        if state in ("PRUNED", "FAILED"):
            axes.plot(epochs[-1], values[-1], marker="x", color=color, markersize=7)
        if number in named or number == best:
            ends.append((epochs[-1], values[-1], number, color))
    low, high = axes.get_ylim()
    for (epoch, value), numbers, color in _end_labels(ends, LABEL_HEIGHT * (high - low), rank, best):
        axes.annotate(numbers, (epoch, value), xytext=(3, 2), textcoords="offset points", fontsize=7, color=color)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole
    if curves and {epoch for _, curve in curves for epoch, _ in curve} == {1}:
        axes.set_xticks([1])  # one epoch only: it was ticked 0.95..1.05, which the locator keeps (audit 39)
    for rung in summary.rungs:
        axes.axvline(rung.epoch, color="tab:orange", linestyle=":", linewidth=1)
    handles = [plt.Line2D([], [], color=c, linestyle=s, label=state) for state, (c, s) in STATE_STYLE.items()
               if state in states.values()]
    if summary.rungs:
        handles.append(plt.Line2D([], [], color="tab:orange", linestyle=":", label="ASHA rung"))
    axes.legend(handles=handles, loc="best", fontsize=8)
    axes.set_xlabel("epoch")
    axes.set_ylabel(summary.metric)
    axes.set_title(f"{summary.metric} per epoch, every trial"
                   + (f" (the {len(named)} best named)" if len(named) < len(curves) else ""))
    return figure


def _rank_key(curve: list[tuple[int, float]], mode: str) -> float:
    """A curve's best value (``best_of``), signed so that the better sorts first."""
    best = best_of((value for _, value in curve if math.isfinite(value)), mode)
    return math.inf if best is None else -best if mode == "max" else best


def _learning_curves_caption(summary: StudySummary) -> str:
    """What the curves' ends mean, for the states the study has: a caption of pruned
    trials' rungs under a study of failed trials and no ASHA misled (audit 39)."""
    states = {row.get("state") for row in summary.rows}
    marks = [text for state, text in (("PRUNED", "pruned trials (dashed) end in x at the rung where ASHA cut them"),
                                      ("FAILED", "failed trials (dotted) end in x at their last reported epoch"))
             if state in states]
    if (summary.best or {}).get("trial") is not None:
        marks.append("the best trial's curve is the thicker one, named \"(best)\"")
    return f"{summary.metric} per epoch" + (f"; {'; '.join(marks)}" if marks else "")


def _end_labels(ends: list[tuple[int, float, int, str]], closer_than: float, rank: dict[int, int] | None = None,
                best: int | None = None):
    """The labels for curves ending at (epoch, value, trial number, colour): one per end,
    except that ends at one epoch whose values lie closer than ``closer_than`` share the
    lowest one's label, naming their trials best first by ``rank`` (else by number:
    "3, 7", or "3, 7, 8, 9, 12 +4" past ``NAMES_PER_LABEL``; by number, the study's best
    trial was among the "+4" at 600 trials, audit 40), the ``best`` one marked so; black
    when their colours differ."""
    rank = rank or {}
    labels: list[tuple[tuple[int, float], str, str]] = []
    group: list[tuple[int, float, int, str]] = []
    for end in sorted(ends, key=lambda end: (end[0], end[1])) + [None]:
        if group and (end is None or end[0] != group[0][0] or end[1] - group[-1][1] >= closer_than):
            colors = {member[3] for member in group}
            numbers = sorted((member[2] for member in group), key=lambda n: (rank.get(n, len(rank)), n))
            text = ", ".join(f"{n} (best)" if n == best else str(n) for n in numbers[:NAMES_PER_LABEL])
            if len(numbers) > NAMES_PER_LABEL:
                text += f" +{len(numbers) - NAMES_PER_LABEL}"
            labels.append(((group[0][0], group[0][1]), text, colors.pop() if len(colors) == 1 else "black"))
            group = []
        if end is not None:
            group.append(end)
    return labels


def _scored_copy(study, summary: StudySummary):
    """An in-memory study in which each COMPLETE or PRUNED trial with a value counts as
    complete, valued at the best it reached (a pruned trial: at the rung it stopped)."""
    import optuna

    if study is None:
        return None
    copy = optuna.create_study(direction="maximize" if summary.mode == "max" else "minimize")
    pick = max if summary.mode == "max" else min
    for trial in study.trials:
        values = [v for v in trial.intermediate_values.values() if math.isfinite(v)]
        if trial.state.name not in ("COMPLETE", "PRUNED") or not values or not trial.params:
            continue
        copy.add_trial(optuna.trial.create_trial(params=trial.params, distributions=trial.distributions,
                                                 value=pick(values), state=optuna.trial.TrialState.COMPLETE))
    return copy if len(copy.trials) >= 2 else None


# The most parameters the parallel-coordinates plot draws, the most important first: its
# 32 axes and their tick labels ran into one another (audit 83).
PARALLEL_AXES = 8


def _importance_evaluator():
    """PED-ANOVA, which needs no scikit-learn (Optuna's default, fANOVA, does, and
    scikit-learn brings SciPy into every trial worker's Lightning import: models/data/README.md)."""
    import optuna

    return optuna.importance.PedAnovaImportanceEvaluator()


def _ranked_parameters(scored) -> list[str]:
    """The searched parameters, the most important first; [] where they cannot be ranked
    (too few trials, one distinct value)."""
    import optuna

    if scored is None:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            return list(optuna.importance.get_param_importances(scored, evaluator=_importance_evaluator()))
        except (ValueError, RuntimeError):
            return []


def _optuna_plot(name: str, scored, summary: StudySummary, importances: bool = False,
                 params: list[str] | None = None, height: float = 4.5):
    """One of Optuna's plots of ``scored`` (``_scored_copy``); ``importances``: ranked by
    PED-ANOVA (``_importance_evaluator``); ``params``: those to draw (None: all);
    ``height``: the figure's, in inches (a bar a parameter needs room: 32 labels overlapped
    in 4.5 inches; audit 83)."""
    import optuna
    import optuna.visualization.matplotlib as optuna_plots

    if scored is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # Matplotlib's note on a plot whose values are all equal (e.g. every trial failed alike).
        warnings.filterwarnings("ignore", message="Attempting to set identical low and high")
        options = {"evaluator": _importance_evaluator()} if importances else {}
        try:
            axes = getattr(optuna_plots, name)(scored, params=params, target_name=summary.metric, **options)
        except (ValueError, RuntimeError) as exc:  # e.g. importances with a single distinct value
            warnings.warn(f"report: {name} skipped: {exc}", stacklevel=2)
            return None
    axes = axes.flat[0] if hasattr(axes, "flat") else axes
    figure = axes.figure
    figure.set_size_inches(8, height)
    return figure


def best_so_far(rows: list[dict[str, Any]], mode: str) -> list[tuple[int, float]]:
    """(trial, the best value of the complete trials up to it), at each complete trial, in
    the order the trials were sampled: Optuna's optimization history, which asks whether
    the sampler found better values as the search went on. Pruned trials' values are from
    an early rung and are no candidates (``TrialsTable.best_row``)."""
    points, best = [], None
    for row in sorted(rows, key=lambda row: int(row["trial"])):
        value = row.get("best")
        if row.get("state") != "COMPLETE" or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        best = value if best is None else best_of((best, value), mode)
        points.append((int(row["trial"]), best))
    return points


def _history_plot(summary: StudySummary):
    """Each trial's best value by its number (complete filled, pruned hollow), the best
    complete trial so far as a step line, and the study's best marked."""
    import matplotlib.pyplot as plt

    scored = [row for row in summary.rows if row.get("state") in ("COMPLETE", "PRUNED")
              and isinstance(row.get("best"), (int, float)) and math.isfinite(row["best"])]
    if not scored:
        return None
    figure, axes = plt.subplots(figsize=(8, 4))
    for state, style in (("PRUNED", {"facecolors": "none", "edgecolors": "tab:gray"}),
                         ("COMPLETE", {"color": "tab:blue"})):
        picked = [row for row in scored if row["state"] == state]
        if picked:
            axes.scatter([int(row["trial"]) for row in picked], [row["best"] for row in picked], s=18,
                         label=f"{state.lower()} trial", zorder=2, **style)
    history = best_so_far(summary.rows, summary.mode)
    if history:
        trials, values = zip(*history)
        last = max(int(row["trial"]) for row in scored)
        axes.step([*trials, last], [*values, values[-1]], where="post", color="tab:red", label="best so far",
                  zorder=3)
    best = summary.best or {}
    if best.get("trial") is not None and best.get("value") is not None:
        axes.scatter([int(best["trial"])], [float(best["value"])], marker="*", s=160, color="tab:red",
                     label=f"best (trial {best['trial']})", zorder=4)
    axes.set_xlabel("trial (in the order sampled)")
    axes.set_ylabel(summary.metric)
    axes.set_title(f"search progress: each trial's best {summary.metric}, and the best so far")
    axes.legend(fontsize=8)
    return figure


def _rungs_plot(summary: StudySummary):
    import matplotlib.pyplot as plt

    if not summary.rungs:
        return None
    figure, axes = plt.subplots(figsize=(6, 3.5))
    labels = [f"epoch {r.epoch}" for r in summary.rungs]
    positions = range(len(labels))
    axes.bar([p - 0.2 for p in positions], [r.reached for r in summary.rungs], width=0.4, label="reached the rung")
    axes.bar([p + 0.2 for p in positions], [r.kept for r in summary.rungs], width=0.4, label="kept (not pruned there)")
    axes.set_xticks(list(positions), labels)
    axes.set_ylabel("trials")
    axes.set_title("ASHA rungs: trials reached and kept")
    axes.legend(fontsize=8)
    return figure


def _compute_plot(summary: StudySummary):
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    labels = ["spent", "saved by pruning", "saved by early stopping"]
    values = [summary.compute_s, summary.saved_by_pruning_s, summary.saved_by_early_stopping_s]
    axes.bar(labels, values, color=["tab:blue", "tab:gray", "tab:green"])
    axes.set_ylabel("trial-seconds")
    axes.set_title("compute spent vs saved")
    return figure


def _cell(value: Any) -> str:
    """A table cell whose raw value stays machine-readable in ``data-value``."""
    raw = "" if value is None else str(value)
    if isinstance(value, float):  # no exponent for a large figure, as its column's whole numbers have none
        shown = f"{value:.0f}" if 1e4 <= abs(value) < 1e15 else f"{value:.4g}"
    else:
        shown = raw
    return f'<td data-value="{html.escape(raw, quote=True)}">{html.escape(shown)}</td>'


def _table(table_id: str, header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _image(images: dict[str, Path], name: str, caption: str) -> str:
    if name not in images:
        return f'<p class="missing">No {html.escape(name.replace("_", " "))} plot: too few scored trials.</p>'
    data = base64.b64encode(images[name].read_bytes()).decode()
    return (f'<figure><img id="{name}" alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _speed_rows(summary: StudySummary) -> tuple[list[dict[str, Any]], str]:
    """The speed table's trials, and a line on those left out: every trial up to
    ``SPEED_ROWS``; past them, the ``SLOWEST_SHOWN`` slowest per epoch, every data-starved
    one and the best, which are what the table is read for (it listed 1,800 rows, a page of
    1.9 MB; audit 40), under the medians of all of them."""
    rows = summary.rows
    if len(rows) <= SPEED_ROWS:
        return rows, ""

    def figure(row: dict[str, Any], key: str) -> float | None:
        try:
            value = float(row.get(key))
        except (TypeError, ValueError):
            return None
        return value if math.isfinite(value) else None

    timed = sorted((row for row in rows if figure(row, "epoch_time_s") is not None),
                   key=lambda row: -figure(row, "epoch_time_s"))
    best = (summary.best or {}).get("trial")
    picked = {id(row) for row in timed[:SLOWEST_SHOWN]} | {
        id(row) for row in rows if str(row.get("data_starved")) == "True" or str(row.get("trial")) == str(best)}
    medians = []
    for key, label in (("samples_per_s", "samples/s"), ("epoch_time_s", "epoch s"), ("startup_s", "start-up s"),
                       ("data_wait_s", "data wait s")):
        values = sorted(v for v in (figure(row, key) for row in rows) if v is not None)
        if values:
            medians.append(f"{label} {values[len(values) // 2]:.4g}")
    note = (f"{len(rows)} trials; medians: {', '.join(medians) or 'none measured'}. Shown: the {SLOWEST_SHOWN} "
            f"slowest per epoch, every data-starved one and the best; trials.csv has every trial.")
    return [row for row in rows if id(row) in picked], note


def _html(summary: StudySummary, images: dict[str, Path], parallel_of: tuple[int, int] | None = None) -> str:
    """The page; ``parallel_of``: (drawn, searched) where the parallel-coordinates plot
    draws only the most important parameters."""
    best = summary.best or {}
    best_rows = [["value", best.get("value")], ["trial", best.get("trial")], ["state", best.get("state")],
                 ["epochs", best.get("epochs")]]
    best_rows += [[label, best[key]] for key, label in (("best_epoch", "best at epoch"), ("seed", "seed"))
                  if best.get(key) is not None]  # a best.json of before 2026-12-06 has neither
    best_rows += [[f"param {k}", v] for k, v in (best.get("params") or {}).items()]
    best_rows += [[f"test {k}", v] for k, v in (best.get("test_metrics") or {}).items()]
    ahead = best.get("ahead") or best.get("pruned_ahead")  # the latter: a best.json of before 2026-12-07
    if ahead:  # not the best by its rule (TrialsTable.best_row), but better
        best_rows.append([f"{str(ahead.get('state') or 'PRUNED').lower()}, scored better",
                          f"trial {ahead['trial']}: {ahead['value']}"])
    counts = [[state, count] for state, count in summary.counts.items()]
    failed = [[row.get("trial"), row.get("epochs"), row.get("reason")] for row in summary.rows
              if row.get("state") == "FAILED"]
    rungs = [[r.epoch, r.reached, r.kept] for r in summary.rungs]
    compute = [["spent", round(summary.compute_s, 3)], ["saved by pruning", round(summary.saved_by_pruning_s, 3)],
               ["saved by early stopping", round(summary.saved_by_early_stopping_s, 3)],
               ["study wall time", round(summary.wall_s, 3)]]
    speed_rows, speed_note = _speed_rows(summary)
    speed = [[row.get(key) for key, _ in SPEED_COLUMNS] for row in speed_rows]
    sections = [
        f"<h1>hpsearch report: {html.escape(_shown_name(summary))}</h1>",
        f'<p>{html.escape(summary.experiment_dir)} · {counted(summary.trials, "trial")} · metric '
        f'<b>{html.escape(summary.metric)}</b> ({summary.mode}) · written {time.strftime("%Y-%m-%d %H:%M:%S")}</p>',
        "<h2>Best configuration</h2>",
        _table("best", ["", "value"], best_rows) if best else "<p>No trial has a result yet.</p>",
        *(["<p>The best trial so far: the search is running, and evaluates its best trial on the test split "
           "when it ends.</p>"] if best.get("evaluated") is False and summary.search_running else
          [f"<p>The best trial so far: the search ended before evaluating it on the test split; "
           f"<code>{html.escape(resume_command(summary.experiment_dir))}</code> does.</p>"]
          if best.get("evaluated") is False else []),
        "<h2>Trials</h2>", _table("counts", ["state", "trials"], counts),
        *(["<h3>Failed trials</h3>", _table("failed", ["trial", "epochs", "reason"], failed)] if failed else []),
        "<h2>Search progress</h2>",
        _image(images, "history", "each trial's best value by its number, in the order sampled (pruned trials "
                                  "hollow: the best value each reached before ASHA stopped it), and the best "
                                  "complete trial so far"),
        "<h2>Learning curves</h2>",
        _image(images, "learning_curves", _learning_curves_caption(summary)),
        "<h2>Parameters vs metric</h2>",
        _image(images, "parallel_coordinates", "parallel coordinates; pruned trials count with the best value "
                                               "they reached before ASHA stopped them"
               + (f"; the {parallel_of[0]} most important of the {parallel_of[1]} parameters, by the importances "
                  f"below" if parallel_of else "")),
        _image(images, "param_importances", "parameter importances (Optuna's PED-ANOVA), same trials"),
        "<h2>ASHA rungs</h2>",
        _table("rungs", ["rung epoch", "trials reached", "trials kept"], rungs) if rungs else
        "<p>No ASHA scheduler in this study.</p>",
        _image(images, "rungs", "trials that reached each rung and trials ASHA kept there") if rungs else "",
        "<h2>Compute</h2>", _table("compute", ["", "trial-seconds"], compute),
        _image(images, "compute", "compute spent, and compute not spent because trials stopped early"),
        "<h2>Speed per trial</h2>", *([f"<p>{html.escape(speed_note)}</p>"] if speed_note else []),
        _table("speed", [label for _, label in SPEED_COLUMNS], speed),
    ]
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;"
             "text-align:right}th{background:#f3f3f3}img{max-width:100%}figcaption{font-size:90%;color:#555}"
             "#failed td:last-child{text-align:left}")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>hpsearch report: {html.escape(_shown_name(summary))}</title><style>{style}</style></head><body>"
            + "\n".join(sections) + "</body></html>\n")

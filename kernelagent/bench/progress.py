"""Progress of a bench run: a rich live panel on a terminal, plain lines otherwise.

The runner calls the methods below from many threads; every method takes the lock.
Off a terminal (CI logs, pipes) nothing redraws: one line when the run starts, one per
finished problem, one at the end.

Problem keys and a record's status may be a candidate's or a file's text: every line and every
cell goes through kernelagent.text.terminal_text, as rich Text (never parsed as markup).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kernelagent.text import plural, terminal_text


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def describe_record(record: dict) -> str:
    """'correct, 1.52x vs inductor' / 'incorrect' / 'correct (2/3 samples, timing not meaningful)'."""
    text = "correct" if record.get("correct") else (record.get("status") or "failed")
    extras = []
    if (record.get("samples") or 0) > 1:
        extras.append(f"{record.get('correct_samples', 0)}/{record['samples']} samples correct")
    if record.get("correct"):
        for field, name in (("inductor", "inductor"), ("eager", "eager")):
            if record.get(f"speedup_{field}") is not None:
                bounds = record.get(f"interval_{field}")
                text += f", {record[f'speedup_{field}']:.2f}x" + (
                    f" [{bounds[0]:.2f}, {bounds[1]:.2f}]" if isinstance(bounds, (list, tuple)) and len(bounds) == 2
                    else "") + f" vs {name}"
                break
        else:
            if not record.get("timings_meaningful"):
                extras.append("timing not meaningful")
    return text + (f" ({', '.join(extras)})" if extras else "")


class BenchProgress:
    def __init__(self, console: Console | None = None, live: bool | None = None, quiet: bool = False):
        self.console = console or Console(stderr=True)
        self.quiet = quiet
        self.use_live = (self.console.is_terminal and not quiet) if live is None else live
        self.lock = threading.RLock()
        self._live: Live | None = None
        self.run_id = ""
        self.mode = ""
        self.total = 0
        self.done = 0  # finished problems, earlier sessions included
        self.done_now = 0  # finished in this session (for the ETA)
        self.correct = 0
        self.evaluations = 0
        self.reused = 0
        self.tokens = 0
        self.cost = 0.0
        self.started = time.monotonic()
        self.devices: dict[str, str] = {}  # device label -> problem key being evaluated ('' idle)
        self.agents: set[str] = set()  # problems with the agent running
        self.best: list[tuple[float, str, str]] = []  # (speedup, baseline, key)
        self.recent: list[str] = []
        self.parallel = 1

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> "BenchProgress":
        if self.use_live:
            self._live = Live(get_renderable=self.render, console=self.console, refresh_per_second=4,
                              transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    def _line(self, text: str) -> None:
        if self._live is None and not self.quiet:
            self.console.print(terminal_text(text), markup=False, highlight=False, soft_wrap=True)
        elif self._live is not None:
            self._live.refresh()

    # -- events ------------------------------------------------------------------------
    def begin(self, run_id: str, mode: str, total: int, done: int, correct: int, devices: list[str],
              parallel: int, resumed: bool, jobs: str = "") -> None:
        with self.lock:
            self.run_id, self.mode, self.total, self.done, self.correct = run_id, mode, total, done, correct
            self.devices = {d: "" for d in devices}
            self.parallel = max(1, parallel)
            self.started = time.monotonic()
            what = "resuming" if resumed else "starting"
            skip = f", {done} already done" if done else ""
            where = f"evaluating on {', '.join(devices)}" if devices else "nothing left to do"
            if devices and jobs:
                where += f", {jobs}"
            self._line(f"bench: {what} run {run_id} ({mode}): {plural(total, 'problem')}{skip}; {where}")

    def eval_started(self, device: str, key: str) -> None:
        with self.lock:
            self.devices[device] = key
            if self._live is not None:
                self._live.refresh()

    def eval_finished(self, device: str, reused: bool = False) -> None:
        with self.lock:
            if not reused:
                self.devices[device] = ""
                self.evaluations += 1
            else:
                self.reused += 1

    def agent_started(self, key: str) -> None:
        with self.lock:
            self.agents.add(key)

    def charge(self, tokens: int, cost: float) -> None:
        with self.lock:
            self.tokens += tokens
            self.cost += cost

    def problem_finished(self, key: str, record: dict, counted: bool = True) -> None:
        with self.lock:
            self.agents.discard(key)
            self.done += 1
            self.done_now += 1
            self.correct += bool(record.get("correct"))
            if not self.mode == "agent":  # agent tokens were charged live
                self.tokens += int((record.get("tokens") or {}).get("total") or 0)
                self.cost += float(record.get("cost_usd") or 0.0)
            for baseline, field in (("inductor", "speedup_inductor"), ("eager", "speedup_eager")):
                if record.get("correct") and record.get(field) is not None:
                    self.best.append((float(record[field]), baseline, key))
                    self.best.sort(reverse=True)
                    del self.best[3:]
                    break
            line = f"[{self.done}/{self.total}] {key}: {describe_record(record)}"
            self.recent = (self.recent + [line])[-6:]
            self._line(f"{line} | pass {self.correct}/{self.done} | {self.tokens} tokens ${self.cost:.4f} | "
                       f"ETA {_duration(self.eta())}")

    def end(self, metrics: dict, out_dir: str, evaluations: int) -> None:
        with self.lock:
            rate = metrics.get("correctness_rate")
            self._line(f"bench: run {self.run_id} finished: {metrics.get('correct', 0)}/{metrics.get('problems', 0)} "
                       f"correct ({0 if rate is None else rate:.0%}); {plural(evaluations, 'evaluation')} this session, "
                       f"{self.reused} reused from the store; {_duration(time.monotonic() - self.started)}; "
                       f"report: {out_dir}/report.html")

    # -- derived -----------------------------------------------------------------------
    def eta(self) -> float | None:
        remaining = self.total - self.done
        if remaining <= 0:
            return 0.0
        if not self.done_now:
            return None
        return (time.monotonic() - self.started) / self.done_now * remaining

    def render(self) -> Panel:
        def text(value: str, **style: Any) -> Text:
            return Text(terminal_text(value), **style)

        with self.lock:
            header = text(f"run {self.run_id} ({self.mode})  problems {self.done}/{self.total}  "
                          f"pass {self.correct}/{self.done or 0}  evaluations {self.evaluations} "
                          f"(+{self.reused} from the store)  tokens {self.tokens}  ${self.cost:.4f}  "
                          f"elapsed {_duration(time.monotonic() - self.started)}  ETA {_duration(self.eta())}")
            table = Table.grid(padding=(0, 2))
            table.add_column("device", style="bold")
            table.add_column("in flight")
            for device, key in self.devices.items():
                table.add_row(text(device), text(key or "idle"))
            parts: list[Any] = [header, table]
            if self.agents:
                parts.append(text(f"agents running ({len(self.agents)}): {', '.join(sorted(self.agents))}"))
            if self.best:
                parts.append(text("best: " + "; ".join(f"{k} {s:.2f}x vs {b}" for s, b, k in self.best)))
            parts.extend(text(line, style="dim") for line in self.recent)
            return Panel(Group(*parts), title="kernelagent bench", border_style="cyan")

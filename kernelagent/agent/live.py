"""Progress display for a run: a rich Live panel on a terminal, one plain line per event
otherwise (CI logs, pipes, tests). Receives the loop's `notify(event, **data)` calls.

Verdicts, tool names and stop details may be the model's or a candidate's text: every line and
cell goes through kernelagent.text.terminal_text, as rich Text (never parsed as markup)."""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kernelagent.agent.budget import Budget
from kernelagent.text import plural, terminal_text


def describe_obs(obs: Any) -> str:
    """'correct, 1.23x vs inductor' / 'compile_error' / 'correct (timing not meaningful)'."""
    text = "correct" if obs.passed else obs.verdict
    if obs.passed and obs.timed:
        if not obs.measurable:
            text += " (timing not meaningful on CPU)"
        else:
            for name, label in (("compile", "inductor"), ("eager", "eager")):
                if name in obs.speedups:
                    bounds = (getattr(obs, "intervals", None) or {}).get(name)
                    text += f", {obs.speedups[name]:.2f}x" + (
                        f" [{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds and len(bounds) == 2 else "") + f" vs {label}"
                    break
    return text


def _limit(value: Any, limit: Any, fmt: str = "{}") -> str:
    return fmt.format(value) + (f" / {fmt.format(limit)}" if limit else "")


class LiveView:
    def __init__(self, budget: Budget, console: Console | None = None,
                 live: bool | None = None, quiet: bool = False) -> None:
        self.console = console or Console(stderr=True)
        self.budget = budget
        self.quiet = quiet
        self.use_live = (self.console.is_terminal and not quiet) if live is None else live
        self.events: deque[str] = deque(maxlen=8)
        self.header = ""
        self.last_tool = "-"
        self.best = "-"
        self.search = ""  # a search's round and population (kernelagent/search)
        self.region = ""  # a whole model's region in progress (orchestrate/whole_model.py)
        self._live: Live | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> "LiveView":
        if self.use_live:
            self._live = Live(get_renderable=self.render, console=self.console,
                              refresh_per_second=4, transient=False)
            self._live.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            if exc_type is KeyboardInterrupt:
                # The terminal's "^C" has moved the cursor under rich's feet: a last refresh
                # in place would draw the panel's top border a second time. Erase the live
                # area instead and print the final panel once, as plain output.
                live.transient = True
                live.stop()
                self.console.print(self.render())
                return
            live.refresh()
            live.stop()

    # -- events ------------------------------------------------------------------------
    def __call__(self, event: str, **data: Any) -> None:
        line = getattr(self, f"on_{event}", lambda **_: None)(**data)
        if not line:
            return
        line = terminal_text(line)
        self.events.extend(line.splitlines())  # a line and its warning (on_plan) are two events
        if self._live is not None:
            self._live.refresh()
        elif not self.quiet:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def on_start(self, problem: str, model: str, mode: str, device: str, out: str) -> str:
        self.header = f"{problem} | {model} | mode {mode} | {device}"
        return f"kernelagent: optimizing {problem} with {model} (mode {mode}) on {device}; output in {out}"

    @staticmethod
    def _turn(turn: int, budget: dict, node: int | None) -> str:
        """'turn 3/14' (a search's lines add the node: 'turn 3/14 (node 2)'). Turns count model
        calls from 1; nodes are the search tree's, numbered from 0 as in trajectory.json."""
        return (f"turn {turn}{'/' + str(budget['max_turns']) if budget.get('max_turns') else ''}"
                + (f" (node {node})" if node is not None else ""))

    def on_model(self, turn: int, reply: Any, budget: dict, node: int | None = None) -> str:
        calls = ", ".join(c.name for c in reply.tool_calls) or "text reply"
        return (f"{self._turn(turn, budget, node)}: model -> {calls} ({reply.usage.total_tokens} tokens, "
                f"${reply.cost_usd:.4f}, {reply.latency_s:.1f} s)")

    def on_model_error(self, turn: int, node: int | None, error: str, budget: dict) -> str:
        return f"{self._turn(turn, budget, node)}: model error: {error}"

    def on_tool(self, tool: str, obs: Any, best: Any, turn: int | None, node: int | None = None) -> str:
        self.last_tool = f"{tool} -> {describe_obs(obs)}"
        if best is not None:
            self.best = describe_obs(best)
        where = f"node {node}" if node is not None else f"turn {turn}"
        return f"{where}: {tool} -> {describe_obs(obs)} ({obs.seconds:.1f} s)"

    def on_warning(self, **warning: Any) -> str:
        if warning.get("last_turn"):
            return "budget: last turn"
        return f"budget: {warning.get('percent')}% of the {warning.get('limit')} budget used"

    def on_round(self, round: int, planned: int, size: dict, best: Any) -> str:
        self.search = (f"round {round}: {plural(planned, 'call')}; tree {plural(size.get('nodes', 0), 'node')}, "
                       f"{size.get('evaluated', 0)} evaluated, {size.get('duplicates', 0)} duplicates, "
                       f"{size.get('correct', 0)} correct")
        if best is not None:
            self.best = describe_obs(best)
        return f"search {self.search}; best so far: {self.best}"

    def on_stop(self, reason: str, detail: str) -> str:
        return f"stopped: {reason}: {detail}"

    def on_verify(self, code_sha: str) -> str:
        return f"re-verifying candidate {code_sha} with the full trial count"

    def on_end(self, result: Any) -> str:
        best = describe_obs(result.best) if result.best else "none"
        if self.region:  # one region of a whole model: not the command's end, and not its exit code
            return f"region's agent run: {result.outcome}; best: {best}"
        return f"result: {result.outcome} (exit {result.exit_code}); best: {best}; target: {result.target_check}"

    # -- a whole model (orchestrate/whole_model.py): its steps around each region's own events --
    def on_plan_start(self, problem: str, device: str) -> str:
        self.header = f"{problem} | whole model | {device}"
        self.region = "planning"
        return f"planning {problem}: profiling its forward on {device} in a child process"

    def on_plan(self, regions: int, chosen: list, totals: dict) -> str:
        """The plan's line, then its own warning where its numbers disagree (totals["warning"],
        wholemodel/plan.py warnings: one line each), as `kernelagent plan` prints it."""
        listed = ", ".join(f"{rid} ({kind}, {share:.1%})" for rid, share, kind in chosen) or "none"
        self.region = f"0/{len(chosen)} regions"
        line = f"plan: {plural(regions, 'region')}; optimising {len(chosen)}: {listed}"
        said = [w for w in str((totals or {}).get("warning") or "").splitlines() if w]  # one line each
        return "\n".join([line, *(f"warning: {w}" for w in said)])

    def on_region(self, region: str, index: int, count: int, share: float, kind: str, resumed: bool) -> str:
        self.region = f"{index}/{count}: {region} ({kind}, {share:.1%} of the model's time)"
        self.best = "-"
        self.last_tool = "-"
        return f"region {index}/{count}: {region} ({kind}, {share:.1%}){', resumed' if resumed else ''}"

    def on_region_done(self, region: str, status: str, why: str, speedup: float | None = None) -> str:
        speed = f", {speedup:.3f}x" if speedup else ""
        return f"{region}: {status}{speed}" + (f": {why}" if why else "")

    def on_splice(self, region: str, status: str, why: str, speedup: float | None = None) -> str:
        self.region = f"end-to-end checks: {region}"
        speed = f" ({speedup:.3f}x vs eager)" if speedup else ""
        return f"{region} spliced alone into the model: {status}{speed}" + (f": {why}" if why else "")

    def on_e2e(self, verdict: str, spliced: list, speedup: float | None, interval: Any, baseline: str | None) -> str:
        self.region = "done"
        speed = (f", {speedup:.3f}x [{interval[0]:.3f}, {interval[1]:.3f}] vs {baseline}" if speedup and interval
                 else "")
        return f"end to end: {verdict}{speed}; spliced: {', '.join(spliced) or 'none'}"

    # -- the live panel ----------------------------------------------------------------
    def render(self) -> Panel:
        def text(value: Any, **style: Any) -> Text:
            return Text(terminal_text(value), **style)

        b = self.budget
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        if self.region:
            table.add_row("region", text(self.region))
        table.add_row("turn", _limit(b.turns, b.max_turns))
        if self.search:
            table.add_row("search", text(self.search))
        table.add_row("last tool", text(self.last_tool))
        table.add_row("best", text(self.best))
        table.add_row("tokens", _limit(b.tokens, b.max_tokens))
        table.add_row("cost", _limit(b.cost, b.max_cost, "${:.4f}"))
        table.add_row("elapsed", _limit(round(b.elapsed), b.timeout and round(b.timeout), "{} s"))
        log = text("\n".join(self.events), style="dim")
        return Panel(Group(table, Text(""), log), title=text(f"kernelagent: {self.header}"),
                     title_align="left")

"""What CI reads: JUnit XML (one test case per kernel), JSON, and a Markdown table for the
GitHub step summary ($GITHUB_STEP_SUMMARY). All rendered from the same KernelCheck facts.

Their text carries what candidates wrote (reasons, logs, flag messages) and what the
repository names: each format gets it through its sanitiser in kernelagent/text.py, so no
candidate can make the JUnit file unparseable, inject HTML or break the Markdown table, or
send escape sequences to the terminal."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from kernelagent.ci.verify import BASELINE_NAMES, KernelCheck, VerifyReport
from kernelagent.text import markdown_text, plural, terminal_text, xml_text


def _detail(check: KernelCheck) -> str:
    lines = [f"problem: {check.problem} (sha256 {check.problem_sha256[:12]})",
             f"kernel: {check.kernel} (sha256 {check.kernel_sha256[:12]})",
             f"verdict: {check.verdict}"]
    lines += [f"failure: {f}" for f in check.failures]
    lines += [f"note: {n}" for n in check.notes]
    if check.result is not None and not check.correct and check.result.log:
        lines += ["", "candidate log (tail):", *check.result.log.strip().splitlines()[-20:]]
    return "\n".join(lines)


def junit_xml(report: VerifyReport, suite: str = "kernelagent verify") -> str:
    failures = len(report.failed)
    root = ET.Element("testsuites", name=suite, tests=str(len(report.checks)), failures=str(failures),
                      errors="0", time=f"{report.wall_s:.3f}")
    node = ET.SubElement(root, "testsuite", name=suite, tests=str(len(report.checks)), failures=str(failures),
                         errors="0", skipped="0", time=f"{report.wall_s:.3f}")
    props = ET.SubElement(node, "properties")
    device = report.environment.get("gpu_name") if report.speed_checked else "cpu (Triton interpreter)"
    for key, value in (("device", device), ("speed_checked", str(report.speed_checked).lower()),
                       ("torch", report.environment.get("torch")), ("triton", report.environment.get("triton")),
                       ("evaluated", report.evaluated), ("reused", report.reused)):
        ET.SubElement(props, "property", name=key, value=str(value))
    for check in report.checks:
        case = ET.SubElement(node, "testcase", classname="kernelagent.verify", name=check.name,
                             file=check.kernel, time=f"{check.seconds:.3f}")
        if check.failures:
            failure = ET.SubElement(case, "failure", message=check.message(), type="kernel-check")
            failure.text = _detail(check)
        out = ET.SubElement(case, "system-out")
        out.text = _detail(check)
    for element in root.iter():  # ElementTree escapes &<>" but writes any character it is given
        element.attrib = {key: xml_text(value) for key, value in element.attrib.items()}
        if element.text:
            element.text = xml_text(element.text)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _speed(check: KernelCheck) -> str:
    if not check.speed_checked or check.speedup is None:
        return "not checked"
    name = BASELINE_NAMES.get(check.baseline or "", check.baseline or "")
    return f"{check.speedup:.2f}x vs {name} (≥ {check.speedup_low:.2f}x)"


def markdown(report: VerifyReport) -> str:
    ok = not report.failed
    n = len(report.checks)
    title = ("### kernelagent verify: " + (("the kernel passes" if n == 1 else f"all {n} kernels pass") if ok else
                                           f"{len(report.failed)} of {plural(n, 'kernel')} fail"))
    rows = ["| kernel | result | verdict | speedup | details |", "| --- | --- | --- | --- | --- |"]
    for check in report.checks:
        mark = "✅ pass" if check.passed else "❌ fail"
        rows.append(f"| `{markdown_text(check.name, code=True)}` | {mark} | {markdown_text(check.verdict)} | "
                    f"{_speed(check)} | {markdown_text(check.message())} |")
    footer = (f"\n{report.evaluated} evaluated, {report.reused} from the store. "
              + ("" if report.speed_checked else "No GPU: correctness checked under the Triton interpreter, "
                 "speed not checked.") + "\n")
    return "\n".join([title, "", *rows]) + "\n" + footer


def append_step_summary(text: str, env: dict[str, str] | None = None) -> Path | None:
    """Append to $GITHUB_STEP_SUMMARY when it is set (GitHub Actions); else do nothing."""
    target = (env if env is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text + "\n")
    return path


def progress_line(check: KernelCheck) -> str:
    """One kernel's line, as verify prints it when the kernel is done."""
    source = " (from the store)" if check.reused else ""
    return terminal_text(f"{check.status.upper():4}  {check.name}: {check.message()}{source}")


def console_lines(report: VerifyReport) -> list[str]:
    """Every kernel's line and the summary, for a terminal (no control character of a candidate's)."""
    lines = [progress_line(check) for check in report.checks]
    state = "all pass" if not report.failed else f"{len(report.failed)} failed: {', '.join(c.name for c in report.failed)}"
    speed = "" if report.speed_checked else "; speed not checked (no GPU)"
    lock = f"; lock {'updated' if report.lock_written else 'unchanged'}: {report.lock_path}"
    lines.append(terminal_text(f"verify: {plural(len(report.checks), 'kernel')}, {state} ({report.evaluated} evaluated, "
                               f"{report.reused} from the store){speed}{lock}"))
    return lines


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str)

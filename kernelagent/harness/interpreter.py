"""Our own interpreters: the command line of every trusted Python process we start (the harness
server, the warm harness, the test zygote, jail_exec, ncu's host side, the MCP helpers, the plan
child, the bytecode helper), and the check each makes of its own import path at start (issue 54, class 1).

`python -m pkg` puts the working directory first on sys.path: an `argparse.py` in the folder
where the user ran `kernelagent verify` ran inside the server, unjailed, and forged its verdict.
So every one of them starts as

    python -I -u -c BOOT ARGS...

`-I` (isolated: no working directory or script folder on the path, no PYTHON* variables, no user
site-packages); BOOT imports `kernelagent` from the very files this process runs (by file
location, so neither another installed copy nor a folder on the path can stand in for it),
appends their folder to the end of sys.path (after the standard library and site-packages, so
it shadows none of them: a checkout run with PYTHONPATH=. works the same), checks the path
(`foreign_entries`) and runs the module. Settings pass through the environment as before; only
PYTHON* names are ignored there (the server's PYTHONUNBUFFERED is `-u`).
"""

from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../kernelagent
PACKAGE_ROOT = PACKAGE_DIR.parent  # the folder that holds it: site-packages, or a checkout
FLAGS = ("-I", "-u")
REFUSED_EXIT = 2

_BOOT = """\
import sys as _s, importlib.util as _u
_d = {pkg!r}
_p = _u.spec_from_file_location("kernelagent", _d + "/__init__.py", submodule_search_locations=[_d])
_m = _u.module_from_spec(_p)
_s.modules["kernelagent"] = _m
_p.loader.exec_module(_m)
if {root!r} not in _s.path:
    _s.path.append({root!r})
del _s, _u, _d, _p, _m
from kernelagent.harness.interpreter import refuse_foreign_path as _r
_r()
del _r
"""


def boot() -> str:
    return _BOOT.format(pkg=str(PACKAGE_DIR), root=str(PACKAGE_ROOT))


def _run_line(module: str) -> str:
    return f"import runpy\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"


def module_argv(module: str, *args: str) -> list[str]:
    """The command line that runs `module` (as `python -m` would, __main__ and all) in an
    isolated interpreter of this installation."""
    return [sys.executable, *FLAGS, "-c", boot() + _run_line(module), *args]


def code_argv(code: str, *args: str) -> list[str]:
    """The command line that runs `code` (sys.argv[1:] are `args`) in an isolated interpreter
    of this installation."""
    return [sys.executable, *FLAGS, "-c", boot() + code, *args]


def module_of(argv: list[str]) -> tuple[str, list[str]] | None:
    """(module, its arguments) where `argv` is module_argv's command line (of this interpreter,
    by another name at most: the caller checks that); None for anything else."""
    if len(argv) < 4 or tuple(argv[1:3]) != FLAGS or argv[3] != "-c" or len(argv) < 5:
        return None
    code = argv[4]
    found = re.search(r"runpy\.run_module\('([A-Za-z0-9_.]+)'", code)
    if found is None or code != boot() + _run_line(found.group(1)):
        return None
    return found.group(1), list(argv[5:])


def _real(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def _pth_entries(sitedir: str) -> list[str]:
    """The folders the .pth files of a site directory add to the path (site.addpackage's rule:
    lines that are neither comments nor `import` lines, relative to the site directory)."""
    found: list[str] = []
    try:
        names = sorted(n for n in os.listdir(sitedir) if n.endswith(".pth") and not n.startswith("."))
    except OSError:
        return found
    for name in names:
        try:
            text = Path(sitedir, name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            line = line.rstrip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            found.append(os.path.join(sitedir, line))
    return found


def installation_dirs() -> list[str]:
    """The folders an isolated interpreter of this installation imports from: the standard
    library, site-packages (and what their .pth files add), and this package's own folder."""
    paths = sysconfig.get_paths()
    dirs = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    sites = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    dirs += sites
    for sitedir in [d for d in dirs[2:] if d]:
        dirs += _pth_entries(sitedir)
    version = f"{sys.version_info[0]}{sys.version_info[1]}"
    dirs += [os.path.join(sys.base_prefix, "lib", f"python{version}.zip"), str(PACKAGE_ROOT)]
    return list(dict.fromkeys(_real(d) for d in dirs if d))


def _editable_placeholder(entry: str) -> bool:
    """setuptools' editable install puts a name, not a folder, on the path for its path hook
    (__editable__.NAME.finder.__path_hook__); it names nothing where no such folder exists."""
    return (entry.startswith("__editable__.") and entry.endswith(".__path_hook__") and os.sep not in entry
            and not os.path.lexists(entry))


def foreign_entries(path: list[str] | None = None, cwd: str | None = None) -> list[str]:
    """The entries of `path` (sys.path) that are not this installation's: the working directory
    or '' (whatever else it is), or a folder outside installation_dirs()."""
    if cwd is None:
        try:
            cwd = os.getcwd()
        except OSError:  # a folder gone, or out of a jail's view: on no path then
            cwd = ""
    here = _real(cwd) if cwd else None
    allowed = installation_dirs()
    foreign = []
    for entry in sys.path if path is None else path:
        if not isinstance(entry, str) or entry in ("", "."):
            foreign.append(repr(entry))
            continue
        if _editable_placeholder(entry):
            continue
        real = _real(entry)
        if (real == here and real not in allowed) or not any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in allowed):
            foreign.append(entry)
    return foreign


def refuse_foreign_path(what: str = "a trusted kernelagent process") -> None:
    """Exit at once, with one line on stderr, where this process's sys.path holds anything
    but this installation (foreign_entries)."""
    foreign = foreign_entries()
    if foreign:
        sys.stderr.write(f"kernelagent: {what} refuses to start: its import path holds {foreign[0][:300]}, "
                         "which is not this installation (start it with kernelagent's own command line: "
                         "python -I)\n")
        sys.stderr.flush()
        os._exit(REFUSED_EXIT)


def identity() -> list[str]:
    """What an interpreter started by module_argv imports from, as strings (the warm harness's
    key): the interpreter, this package's folder and version, the installation's folders, and
    when each site-packages folder last changed (a package installed or removed there; this
    package's own files are the key's code digest)."""
    from kernelagent import __version__

    parts = [_real(sys.executable), sys.version, str(PACKAGE_DIR), __version__, *installation_dirs()]
    paths = sysconfig.get_paths()
    sites = [paths.get("purelib"), paths.get("platlib")]
    sites += list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    for folder in dict.fromkeys(_real(d) for d in sites if d):
        try:
            parts.append(f"{folder}:{os.stat(folder).st_mtime_ns}")
        except OSError:
            parts.append(f"{folder}:-")
    return parts

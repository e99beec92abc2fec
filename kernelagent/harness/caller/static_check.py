"""The static pass: a cheap first filter over a candidate's source (AST, with line numbers).

Run in the caller's process before any harness process starts, so the obvious exploits are
turned away in milliseconds with a message a model can act on. It is not the defence: the
run-time evidence (defences.py) sees what the code actually does. What it looks for:

- heavy PyTorch calls outside `@triton.jit` functions: torch.matmul/mm/bmm/einsum, `@` on
  tensors, torch.nn.functional's conv/linear/softmax/norms/attention/activations, tensor
  methods such as `.softmax()` or `.matmul()` (no-custom-kernel);
- try/except around a kernel launch (fallback-to-reference);
- streams, threads, processes and executors (hidden-work);
- assignments or setattr on attributes of torch, time, triton, kernelagent, builtins and
  friends, and global numeric modes (tampering, numeric-modes);
- imports of kernelagent, gc, inspect, ctypes, the problem module, and frame access
  (reading-reference, tampering);
- sockets, HTTP clients and subprocesses (sandbox-escape).

Code under `if __name__ == "__main__":` is ignored; so are the bodies of `@triton.jit`
functions (their `tl.sum` or `x.to(...)` are Triton, not PyTorch).

A method call such as `.relu(x)` is judged only after its receiver is resolved (a first pass
over the whole file, `_Receivers`): a name bound to a `load_inline`/`load` result (directly, through
another such name, or through a function that returns one), an imported module, a parameter
that only ever receives an extension (its default, or every call site in the file), or `self`
calling a method its own class defines is not a tensor, so `_ext.relu(x)` is the candidate's
own kernel, not PyTorch's. Likewise `torch.ops.<namespace>.relu` outside ATen's namespaces is a
custom op. Anything else (a parameter, a local, a call's result) may be a tensor and is judged.

The backend decides what a kernel is. For "triton", building C++/CUDA extensions
(`torch.utils.cpp_extension`) is rejected (wrong-backend: use --backend cuda). For "cuda",
`load_inline` is the way kernels are built, and the C++/CUDA strings of the candidate are
scanned too: heavy ATen calls (`at::matmul`, `torch::conv2d`, ...) and vendor libraries
(cuBLAS, cuDNN) are no-custom-kernel; processes, sockets, files and dlopen from native code
(which the Python audit hook cannot see) are sandbox-escape; try/except around the
extension's calls or around the build is fallback-to-reference.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from kernelagent import pyast

HEAVY_TORCH_FUNCS = {
    "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "tensordot", "mv", "addmv", "dot",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution",
    "softmax", "log_softmax", "layer_norm", "group_norm", "batch_norm", "rms_norm", "instance_norm",
    "scaled_dot_product_attention", "cumsum", "cumprod", "logcumsumexp", "relu", "gelu", "silu", "sigmoid",
    "tanh", "softplus", "elu", "selu", "leaky_relu", "hardtanh", "mish", "logsumexp", "cross_entropy",
    "nll_loss", "linear", "bilinear", "var_mean", "std_mean", "clamp_min", "clamp", "clip",
}
# torch.<name> calls that are heavy only as torch functions (as methods they are often glue).
HEAVY_TORCH_ONLY = {"sum", "mean", "amax", "amin", "max", "min", "var", "std", "norm", "prod", "sort", "topk"}
HEAVY_METHODS = {
    "matmul", "mm", "bmm", "addmm", "baddbmm", "softmax", "log_softmax", "cumsum", "cumprod", "relu",
    "gelu", "sigmoid", "tanh", "logsumexp", "einsum", "layer_norm", "conv2d",
}
PATCH_ROOTS = {"torch", "time", "triton", "kernelagent", "builtins", "gc", "inspect", "sys", "threading",
               "numpy", "math", "os", "ctypes", "importlib", "tl"}
BANNED_IMPORTS = {
    "kernelagent": ("tampering", "imports the harness (kernelagent)"),
    "gc": ("reading-reference", "imports gc (object scanning)"),
    "inspect": ("reading-reference", "imports inspect (frame access)"),
    "ctypes": ("tampering", "imports ctypes (raw memory and C calls)"),  # info: see _INFO_IMPORTS
    "problem": ("reading-reference", "imports the problem module"),
    "kernelagent_problem": ("reading-reference", "imports the problem module"),
    "socket": ("sandbox-escape", "imports socket (network)"),
    "urllib": ("sandbox-escape", "imports urllib (network)"),
    "http": ("sandbox-escape", "imports http (network)"),
    "requests": ("sandbox-escape", "imports requests (network)"),
    "subprocess": ("sandbox-escape", "imports subprocess (processes)"),
    "multiprocessing": ("hidden-work", "imports multiprocessing"),
    "threading": ("hidden-work", "imports threading"),
    "_thread": ("hidden-work", "imports _thread"),
    "concurrent": ("hidden-work", "imports concurrent.futures"),
    "asyncio": ("hidden-work", "imports asyncio"),
    "signal": ("tampering", "imports signal"),
}
# Reported, not rejected here: what the code does with them is judged at run time (the audit
# hook sees ctypes calls made by candidate code).
_INFO_IMPORTS = {"ctypes", "signal"}
STREAM_CALLS = {"Stream", "stream", "ExternalStream", "set_stream", "StreamContext"}
NUMERIC_MODE_CALLS = {"set_float32_matmul_precision", "set_default_dtype", "set_default_tensor_type",
                      "use_deterministic_algorithms"}
FRAME_CALLS = {"_getframe", "currentframe", "stack", "getouterframes", "getframeinfo", "_current_frames",
               "get_objects", "get_referrers", "get_referents", "settrace", "setprofile"}
PROCESS_CALLS = {"system", "popen", "fork", "forkpty", "execv", "execve", "execvp", "spawnv", "posix_spawn",
                 "kill", "killpg"}


# In C++/CUDA sources of a cuda candidate (comments removed first).
CPP_HEAVY = re.compile(r"\b(?:at|torch)::(?:native::)?(matmul|mm|bmm|addmm|baddbmm|einsum|linear|conv\w*|"
                       r"softmax|log_softmax|layer_norm|group_norm|batch_norm|rms_norm|scaled_dot_product_attention|"
                       r"cumsum|cumprod|relu|gelu|silu|sigmoid|tanh|logsumexp|sum|mean|amax|amin|max|min|var|std|"
                       r"norm|prod|sort|topk|argmax|argmin|clamp|mse_loss|cross_entropy|nll_loss|max_pool\w*|"
                       r"avg_pool\w*)\s*\(|"
                       r"\.(matmul|mm|bmm|softmax|log_softmax|cumsum|relu|sigmoid|tanh|sum|mean|amax|max|min|sort|"
                       r"topk|argmax|clamp)\s*\(")
CPP_VENDOR = re.compile(r"\b(cublas\w*|cublasLt\w*|cudnn\w*|cusparse\w*|cufft\w*)\b")
CPP_ESCAPE = re.compile(r"\b(system|popen|fork|vfork|execv\w*|execl\w*|posix_spawn\w*|dlopen|dlsym|socket|"
                        r"connect|fopen|freopen|creat|open|openat|unlink|remove|rename|mmap|ptrace|syscall|"
                        r"setenv|putenv|kill)\s*\(|std::(?:i|o)?fstream|std::filesystem|<fstream>|<filesystem>|"
                        r"<dlfcn\.h>|<sys/socket\.h>|<unistd\.h>|<spawn\.h>")
_CPP_HINT = re.compile(r"__global__|#include|torch::|at::|<<<|PYBIND11_MODULE")


@dataclass
class Finding:
    kind: str  # the exploit class, as in defences.SEVERITY
    message: str
    line: int
    severity: str = "reject"

    def message_with_line(self) -> str:
        return f"candidate.py:{self.line}: {self.message}"


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_triton_jit(decorator: ast.AST) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = _dotted(target) or ""
    return name.split(".")[-1] in ("jit", "autotune", "heuristics") and "triton" in name or name == "jit"


def _is_main_guard(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _is_launch(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (isinstance(node.func, ast.Subscript)
                                           or (isinstance(node.func, ast.Attribute) and node.func.attr == "run"))


# torch.ops namespaces that hold PyTorch's own kernels (others are custom ops the candidate built).
_TORCH_OPS_BUILTIN = {"aten", "prims", "quantized", "_c10d_functional", "c10d", "profiler", "_quantized"}


def _is_build_call(node: ast.AST, aliases: dict[str, str]) -> bool:
    """load_inline(...) / cpp_extension.load(...) (not json.load or torch.load)."""
    if not isinstance(node, ast.Call):
        return False
    dotted = _dotted(node.func)
    if dotted is None:
        return False
    head, _, rest = dotted.partition(".")
    full = aliases.get(head, head) + ("." + rest if rest else "")
    last = full.split(".")[-1]
    return last == "load_inline" or (last == "load" and "cpp_extension" in full)


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
            *([a.kwarg] if a.kwarg else [])]


class _Receivers:
    """What the names of a file are bound to, so a call's receiver can be told apart from a tensor.

    Names are keyed by their last component (`self._ext` and `_ext` are both `_ext`): a file
    that binds the same name to an extension in one place and to a tensor in another loses the
    method check on that name, which is a missed finding, never a false one (the run-time
    defences still see what runs)."""

    def __init__(self, tree: ast.Module) -> None:
        self.modules: set[str] = set()  # names bound by import statements
        self.aliases: dict[str, str] = {}
        self.ext: set[str] = set()  # names bound to extension modules
        self.builders: set[str] = set()  # functions that return an extension module
        self.ext_params: dict[ast.AST, set[str]] = {}  # function -> its parameters that are extensions
        self.class_methods: dict[ast.AST, set[str]] = {}  # function -> methods of its enclosing class
        functions: dict[str, list[ast.AST]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = (alias.asname or alias.name).split(".")[0]
                    self.modules.add(local)
                    self.aliases[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    self.modules.add(alias.asname or alias.name)
                    self.aliases[alias.asname or alias.name] = \
                        f"{node.module}.{alias.name}" if node.module else alias.name
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.ClassDef):
                methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                for n in node.body:
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.class_methods[n] = methods
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        assigns = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr))]
        # Fixpoint: extension names, builders and extension parameters feed each other.
        changed = True
        while changed:
            before = (len(self.ext), len(self.builders), sum(map(len, self.ext_params.values())))
            for node in assigns:
                if node.value is not None and self.is_ext(node.value):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        name = _dotted(target)
                        if name:
                            self.ext.add(name.split(".")[-1])
            for name, defs in functions.items():
                if any(self.is_ext(r.value) for d in defs for r in ast.walk(d)
                       if isinstance(r, ast.Return) and r.value is not None):
                    self.builders.add(name)
            for defs in functions.values():
                for fn in defs:
                    self._ext_params(fn, calls)
            changed = before != (len(self.ext), len(self.builders), sum(map(len, self.ext_params.values())))

    def _ext_params(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, calls: list[ast.Call]) -> None:
        params = _params(fn)
        positional = [p.arg for p in (*fn.args.posonlyargs, *fn.args.args)]
        defaults = dict(zip(positional[len(positional) - len(fn.args.defaults):], fn.args.defaults))
        defaults.update({p.arg: d for p, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
        # Call sites: f(...) or obj.f(...) (a method: the receiver takes the first parameter).
        sites = [c for c in calls if (_dotted(c.func) or "").split(".")[-1] == fn.name]
        found = self.ext_params.setdefault(fn, set())
        for p in params:
            if p.arg in found:
                continue
            if p.arg in defaults and self.is_ext(defaults[p.arg]):
                found.add(p.arg)
                continue
            if p.arg not in positional or not sites:
                continue
            index = positional.index(p.arg)
            passed = []
            for c in sites:
                shift = 1 if isinstance(c.func, ast.Attribute) and positional and positional[0] == "self" else 0
                kw = next((k.value for k in c.keywords if k.arg == p.arg), None)
                arg = kw if kw is not None else (c.args[index - shift] if 0 <= index - shift < len(c.args)
                                                 and not any(isinstance(a, ast.Starred) for a in c.args) else None)
                passed.append(arg)
            if all(a is not None and self.is_ext(a) for a in passed):
                found.add(p.arg)

    def is_ext(self, node: ast.AST, fn: ast.AST | None = None) -> bool:
        """Whether `node` evaluates to an extension module built by load_inline/load."""
        if _is_build_call(node, self.aliases):
            return True
        if isinstance(node, ast.Call):
            return (_dotted(node.func) or "").split(".")[-1] in self.builders
        name = _dotted(node)
        if name is None:
            return False
        if fn is not None and "." not in name and name in self.ext_params.get(fn, ()):
            return True
        return name.split(".")[-1] in self.ext

    def not_a_tensor(self, receiver: ast.AST, method: str, fn: ast.AST | None) -> bool:
        """Whether a call `receiver.method(...)` certainly does not call a tensor method."""
        if self.is_ext(receiver, fn):
            return True
        name = _dotted(receiver)
        if name is None:
            return False
        if name.split(".")[0] in self.modules:
            return True  # an imported module (torch's own heavy functions are judged by their name)
        if name == "self" and fn is not None and method in self.class_methods.get(fn, ()):
            return True  # the candidate's own method
        return False


class _Visitor(ast.NodeVisitor):
    def __init__(self, backend: str = "triton", receivers: _Receivers | None = None) -> None:
        self.backend = backend
        self.receivers = receivers or _Receivers(ast.Module(body=[], type_ignores=[]))
        self.scope: list[ast.AST] = []  # enclosing (non-Triton) functions
        self.findings: list[Finding] = []
        self.aliases: dict[str, str] = {}  # local name -> module it names
        self.jit_names: set[str] = set()

    def add(self, kind: str, message: str, node: ast.AST, severity: str = "reject") -> None:
        self.findings.append(Finding(kind, message, getattr(node, "lineno", 0), severity))

    def resolve(self, dotted: str | None) -> str | None:
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head in self.aliases:
            return self.aliases[head] + ("." + rest if rest else "")
        return dotted

    # -- structure -----------------------------------------------------------------------
    def visit_Module(self, node: ast.Module) -> None:
        for stmt in node.body:
            if _is_main_guard(stmt):
                continue
            self.visit(stmt)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if any(_is_triton_jit(d) for d in node.decorator_list):
            self.jit_names.add(node.name)
            return  # Triton code, not PyTorch
        self.scope.append(node)
        try:
            self.generic_visit(node)
        finally:
            self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            root = alias.name.split(".")[0]
            self.aliases[(alias.asname or alias.name).split(".")[0]] = alias.name if alias.asname else root
            self._check_import(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self.add("reading-reference", f"relative import from {'.' * node.level}{module}", node)
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}" if module else alias.name
        self._check_import(module, node)
        if module.split(".")[0] == "torch":
            for alias in node.names:
                self._check_heavy_name(f"{module}.{alias.name}", node, imported=True)

    def _check_import(self, module: str, node: ast.AST) -> None:
        if module.startswith("torch.utils.cpp_extension") and self.backend != "cuda":
            self.add("wrong-backend", "imports torch.utils.cpp_extension: this evaluation's backend is triton "
                                      "(kernels are @triton.jit functions); CUDA C++ candidates are evaluated "
                                      "with --backend cuda", node)
        root = module.split(".")[0]
        if root in BANNED_IMPORTS:
            kind, why = BANNED_IMPORTS[root]
            self.add(kind, f"{why}: kernels may not use it", node,
                     severity="info" if root in _INFO_IMPORTS else "reject")

    # -- try/except around launches ------------------------------------------------------------
    def _is_ext_call(self, node: ast.AST) -> bool:
        """A call into a CUDA extension (ext.fn(...), self.ext.fn(...)) or a load_inline build."""
        if not isinstance(node, ast.Call):
            return False
        if self.receivers.is_ext(node):
            return True
        if isinstance(node.func, ast.Attribute):
            return self.receivers.is_ext(node.func.value, self.scope[-1] if self.scope else None)
        return False

    def visit_Try(self, node: ast.Try) -> None:
        if self.backend == "cuda" and node.handlers and \
                any(self._is_ext_call(n) for stmt in node.body for n in ast.walk(stmt)):
            self.add("fallback-to-reference", "try/except around a CUDA extension call or its build: a failing "
                                              "kernel or build must fail, not fall back to another implementation",
                     node)
        launches = any(_is_launch(n) for stmt in node.body for n in ast.walk(stmt))
        if launches and node.handlers:
            self.add("fallback-to-reference", "try/except around a kernel launch: a failing kernel must fail, "
                                              "not fall back to another implementation", node)
        self.generic_visit(node)

    # -- calls -----------------------------------------------------------------------------
    def _check_heavy_name(self, full: str, node: ast.AST, imported: bool = False) -> None:
        parts = full.split(".")
        if parts[0] != "torch":
            return
        if len(parts) >= 3 and parts[1] == "ops" and parts[2] not in _TORCH_OPS_BUILTIN:
            return  # torch.ops.<the candidate's namespace>.<op>: its own kernel
        name = parts[-1]
        functional = len(parts) >= 3 and parts[1] == "nn" and parts[2] == "functional"
        if name in HEAVY_TORCH_FUNCS or (name in HEAVY_TORCH_ONLY and (len(parts) == 2 or functional)):
            verb = "imports" if imported else "calls"
            self.add("no-custom-kernel", f"{verb} {full}: the heavy work must run in the candidate's own Triton "
                                         "kernels (torch only for glue such as empty, view, reshape, contiguous)",
                     node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        full = self.resolve(_dotted(func))
        if full:
            parts = full.split(".")
            name = parts[-1]
            self._check_heavy_name(full, node)
            if parts[0] == "torch" and "cuda" in parts and name in STREAM_CALLS:
                self.add("hidden-work", f"{full}(): side streams hide work from the timer; launch on the current "
                                        "stream", node)
            if parts[0] == "torch" and name in NUMERIC_MODE_CALLS:
                self.add("numeric-modes", f"{full}() changes a global numeric mode", node)
            if parts[0] in ("sys", "inspect", "gc") and name in FRAME_CALLS:
                self.add("reading-reference", f"{full}(): frame and object scanning are not allowed", node)
            if parts[0] == "os" and name in PROCESS_CALLS:
                self.add("sandbox-escape", f"{full}(): processes and signals are not allowed", node)
            if parts[0] == "threading" or parts[0] == "_thread" or full.startswith("concurrent.futures"):
                self.add("hidden-work", f"{full}(): threads may not do or hide work", node)
            if name == "setattr" and len(parts) == 1 and node.args:
                target = self.resolve(_dotted(node.args[0]))
                if target and target.split(".")[0] in PATCH_ROOTS:
                    self.add("tampering", f"setattr on {target}: patching libraries or the harness", node)
            if name in ("__import__", "import_module") and node.args and isinstance(node.args[0], ast.Constant):
                self._check_import(str(node.args[0].value), node)
            if name in ("exec", "eval", "compile") and len(parts) == 1:
                self.add("tampering", f"{name}() of generated code hides what the candidate runs", node,
                         severity="info")
            if name == "open" and len(parts) == 1:
                self.add("sandbox-escape", "open(): kernels have no reason to read or write files", node,
                         severity="info")
        if isinstance(func, ast.Attribute) and func.attr in HEAVY_METHODS:
            base = self.resolve(_dotted(func.value)) or ""
            fn = self.scope[-1] if self.scope else None
            if base.split(".")[0] not in ("tl", "triton", "math", "np", "numpy", "torch") and \
                    not base.startswith("triton.language") and \
                    not self.receivers.not_a_tensor(func.value, func.attr, fn):
                self.add("no-custom-kernel", f".{func.attr}() on a tensor runs PyTorch's kernel: do the work in "
                                             "the candidate's own Triton kernels", node)
        if isinstance(func, ast.Attribute) and func.attr == "numpy" and not node.args:
            # NumPy on the tensor's storage (issue 24, class 1): the work leaves every kernel
            self.add("no-custom-kernel", ".numpy() hands the tensor's memory to NumPy: the work must run in the "
                                         "candidate's own kernels", node)
        elif isinstance(func, ast.Attribute) and func.attr == "tolist" and not node.args:
            self.add("no-custom-kernel", f".{func.attr}() moves the work off the GPU and out of the kernel", node,
                     severity="info")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.add("no-custom-kernel", "the @ operator runs PyTorch's matmul: do the work in the candidate's "
                                         "own Triton kernels", node)
        self.generic_visit(node)

    # -- patching --------------------------------------------------------------------------------
    def _check_target(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._check_target(elt, node)
            return
        if isinstance(target, ast.Attribute):
            full = self.resolve(_dotted(target))
            if full and full.split(".")[0] in PATCH_ROOTS:
                if full.startswith("torch.backends"):
                    precision = any(w in full for w in ("tf32", "reduced_precision", "allow_fp16", "allow_bf16"))
                    self.add("numeric-modes", f"assigns {full}: global numeric modes are fixed by the harness",
                             node, severity="reject" if precision else "info")
                else:
                    self.add("tampering", f"assigns {full}: patching libraries, the clock or the harness is "
                                          "not allowed", node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target, node)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if self.backend == "cuda" and isinstance(node.value, str) and _CPP_HINT.search(node.value):
            self._scan_cpp(node.value, node.lineno)

    def _scan_cpp(self, text: str, first_line: int) -> None:
        """C++/CUDA source in a string: what the Python-level checks cannot see."""
        code = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        code = re.sub(r"//[^\n]*", "", code)
        code = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', code)  # string literals (TORCH_CHECK messages)
        for offset, line in enumerate(code.splitlines()):
            where = ast.Constant(value=None)
            where.lineno = first_line + offset
            heavy = CPP_HEAVY.search(line)
            if heavy:
                self.add("no-custom-kernel", f"C++ calls {heavy.group(0).strip().rstrip('(')}(): the heavy work must "
                                             "run in the candidate's own __global__ kernels (torch only for glue "
                                             "such as empty, empty_like, contiguous, view)", where)
            vendor = CPP_VENDOR.search(line)
            if vendor:
                self.add("no-custom-kernel", f"C++ uses {vendor.group(1)}: vendor libraries are not the candidate's "
                                             "own kernels", where)
            escape = CPP_ESCAPE.search(line)
            if escape:
                self.add("sandbox-escape", f"C++ uses {escape.group(0).strip().rstrip('(')}: native code may not start "
                                           "processes, open files or sockets, or load libraries", where)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target, node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target, node)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # Private dispatcher entry points run PyTorch's kernels below the dispatch recorder
        # (issue 24, class 1): `torch.ops.aten.<op>.redispatch`, `torch._C._dispatch_*`.
        full = self.resolve(_dotted(node)) or ""
        if node.attr == "redispatch" or node.attr.startswith("_dispatch_") or \
                (full.startswith("torch._C.") and "dispatch" in full.lower()) or full.startswith("torch._ops."):
            self.add("no-custom-kernel", f"{full or '.' + node.attr}: private dispatcher entry points run PyTorch's "
                                         "kernels below the harness's view; the heavy work must run in the "
                                         "candidate's own kernels", node)
        # NumPy on a tensor's storage computes outside every kernel (issue 24, class 1).
        if node.attr in ("__array_interface__", "__array__", "__array_struct__") or \
                full in ("numpy.frombuffer", "numpy.ctypeslib.as_array", "torch.frombuffer"):
            self.add("no-custom-kernel", f"{full or '.' + node.attr}: computing on a tensor's memory outside the "
                                         "candidate's own kernels is not allowed", node)
        if node.attr in ("f_back", "f_locals", "f_globals", "tb_frame", "gi_frame", "cr_frame"):
            self.add("reading-reference", f".{node.attr}: frame access is not allowed", node)
        if node.attr == "modules" and isinstance(node.value, ast.Name) and self.resolve(node.value.id) == "sys":
            self.add("reading-reference", "sys.modules: reaching other modules (the problem, the harness) is not "
                                          "allowed", node)
        self.generic_visit(node)


def check_source(source: str, backend: str = "triton") -> list[Finding]:
    """Findings for `source`, in line order. A file that does not parse gives none (the
    harness reports the syntax error itself)."""
    try:
        tree = pyast.parse(source, filename="candidate.py")
    except SyntaxError:
        return []
    visitor = _Visitor(backend, _Receivers(tree))
    visitor.visit(tree)
    seen = set()
    out = []
    for f in sorted(visitor.findings, key=lambda f: f.line):
        key = (f.kind, f.line, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def summary(findings: list[Finding], limit: int = 3) -> str:
    """One paragraph for the result's reason."""
    head = "; ".join(f"[{f.kind}] {f.message_with_line()}" for f in findings[:limit])
    more = f" (+{len(findings) - limit} more)" if len(findings) > limit else ""
    return f"rejected by the static check before running: {head}{more}"

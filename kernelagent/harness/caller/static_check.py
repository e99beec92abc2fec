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


class _Visitor(ast.NodeVisitor):
    def __init__(self, backend: str = "triton") -> None:
        self.backend = backend
        self.findings: list[Finding] = []
        self.aliases: dict[str, str] = {}  # local name -> module it names
        self.jit_names: set[str] = set()
        self.ext_names: set[str] = set()  # names bound to load_inline(...) results

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
        self.generic_visit(node)

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
        full = self.resolve(_dotted(node.func)) or ""
        if full.split(".")[-1] in ("load_inline", "load") and ("cpp_extension" in full or full in ("load_inline",)):
            return True
        if isinstance(node.func, ast.Attribute):
            base = _dotted(node.func.value) or ""
            return base.split(".")[-1] in self.ext_names
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
            if base.split(".")[0] not in ("tl", "triton", "math", "np", "numpy", "torch") and \
                    not base.startswith("triton.language"):
                self.add("no-custom-kernel", f".{func.attr}() on a tensor runs PyTorch's kernel: do the work in "
                                             "the candidate's own Triton kernels", node)
        if isinstance(func, ast.Attribute) and func.attr in ("numpy", "tolist") and not node.args:
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
        if isinstance(node.value, ast.Call) and (self.resolve(_dotted(node.value.func)) or "").split(".")[-1] in \
                ("load_inline", "load"):
            for target in node.targets:
                name = _dotted(target)
                if name:
                    self.ext_names.add(name.split(".")[-1])
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
        tree = ast.parse(source, filename="candidate.py")
    except SyntaxError:
        return []
    visitor = _Visitor(backend)
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

"""kvlens: step LLM decodes under KV-cache token-selection policies, read every head's rows as
NumPy arrays, record and open .kvtrace files, evaluate and draw figures, and write policies in
Python.

    import kvlens
    model = kvlens.Model(kvlens.demo_model())
    session = kvlens.Session(model, policies="dense,h2o,quest", sparsity=0.5, coref_sample=0)
    while session.step():
        rows = session.rows(run=1)      # rows.logits / .probabilities / .visible / .scores
    print(kvlens.eval_coref(model, "h2o,tokenbutler", sparsity=0.5, samples=20))

Inside kvlens-cli and the app (`--policy-file FILE.py`) only the policy part is present.
"""

import os
import runpy
import sys

from .policy import (DENSE, SCORES, VISIBLE, Bool, Choice, Float, Int, ModelShape, Param,
                     Policy, Visible, policy_classes, visible)

if "_kvlens_embedded" in sys.builtin_module_names:
    import _kvlens_embedded as _core  # kvlens-cli / the app: their engine, policies only
    embedded = True
else:
    from . import _kvlens as _core
    embedded = False

Error = getattr(_core, "Error", RuntimeError)


def register_policy(cls):
    """Registers a kvlens.Policy subclass (usable as a decorator); returns the class.

    Registered, it runs everywhere a built-in does: Session(policies="its_name,h2o"),
    eval_coref(...), figures. Running the defining cell again makes new runs use the new class.
    """
    cls.policy_id = _core._register_policy(cls)
    return cls


def load_policy_file(path):
    """Runs a Python file and registers every kvlens.Policy subclass it defines; returns the ids.

    This is what `kvlens-cli --policy-file FILE.py` and the app's --policy-file do.
    """
    namespace = runpy.run_path(os.fspath(path), run_name="kvlens_policy_file_" +
                               os.path.splitext(os.path.basename(path))[0].replace("-", "_"))
    classes = policy_classes(namespace)
    if not classes:
        raise ValueError(f"{path}: defines no kvlens.Policy subclass")
    for cls in classes:
        cls._kvlens_file = os.path.abspath(path)
    return [register_policy(cls).policy_id for cls in classes]


if not embedded:
    from ._kvlens import (Model, Session, StepRows, Trace, eval_coref, eval_ppl, load_plugin,
                          load_trace, policies)

    has_figures = _core.has_figures
    has_cuda = _core.has_cuda

    def assets_dir():
        """The bundled files (the demo model, the co-reference pools): $KVLENS_ASSETS_DIR, the
        source tree this module was built from, or the installed share/kvlens."""
        return os.environ["KVLENS_ASSETS_DIR"]

    if not os.environ.get("KVLENS_ASSETS_DIR"):
        # Installed: <prefix>/lib/python3*/dist-packages/kvlens -> <prefix>/share/kvlens; else the
        # source tree the module was built from, or the prefix it was configured with.
        _installed = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4,
                                  "share", "kvlens")
        for _candidate in (os.path.normpath(_installed), _core.assets_dir_source,
                           _core.assets_dir_installed):
            if os.path.isdir(_candidate):
                os.environ["KVLENS_ASSETS_DIR"] = _candidate
                break

    def demo_model():
        """The bundled demo model's folder (a 7.9M-parameter Llama with its predictor)."""
        return os.path.join(assets_dir(), "models", "demo")

    def figure(trace, out, view="heads", **options):
        """Writes one of the app's views of a trace (or a session's) as PNG, SVG or PDF, as
        `kvlens-cli figure` does (options: runs, step, layer, head, detail, quantity, linear,
        consensus, retention_layer, retention_head, theme, width, scale, data)."""
        if isinstance(trace, Session):
            trace = trace.trace
        elif isinstance(trace, (str, os.PathLike)):
            trace = load_trace(os.fspath(trace))
        return trace.figure(os.fspath(out), view=view, **options)

    def table(rows, file=None):
        """Prints eval rows as `kvlens-cli eval` prints its table."""
        coref = any(r.get("accuracy") is not None for r in rows)
        out = f"{'policy':<12} {'sparsity':>8} {'effective':>9} "
        out += (f"{'accuracy':>9} {'coverage':>9} {'samples':>8}" if coref else
                f"{'ppl':>10} {'windows':>8} {'tokens':>9}")
        lines = [out]
        for r in rows:
            line = f"{r['policy']:<12} {r['sparsity']:8.3f} {r['effective_sparsity']:9.3f} "
            if coref:
                line += f"{r['accuracy']:9.4f} {r['coverage']:9.4f} {r['samples']:8d}"
            else:
                ppl = r["ppl"] if r["ppl"] is not None else float("nan")
                line += f"{ppl:10.3f} {r['samples']:8d} {r['tokens_scored']:9d}"
            lines.append(line)
        print("\n".join(lines), file=file or sys.stdout)

"""Token-selection policies written in Python: subclass `kvlens.Policy`.

A policy class implements the C plug-in contract (include/kvlens/policy_plugin.h) in Python:
kvlens calls `select(step)` at every decode step and layer (layers below the `dense_layers` knob
stay dense and are not asked) with what a built-in policy sees, and the policy answers with
scores (kvlens then keeps the forced tokens and the best-scored eligible ones up to the budget)
or with a visible set. kvlens applies the budget and the common knobs (sinks, window,
dense_layers, kv_head_granularity, ...) and records, draws and evaluates it like a built-in.

    class MyPolicy(kvlens.Policy):
        '''Keeps the tokens whose keys are closest to the query.'''   # the rule, shown in lists
        name = "my_policy"              # the policy id (default: the class name, lower case)
        family = "query-aware"
        params = {"alpha": kvlens.Float(0.5, 0.0, 1.0, "mixing weight")}   # or {"alpha": 0.5}
        needs = {"logits"}              # what select() reads (see below)

        def __init__(self, shape, **params):   # optional: one instance per run
            super().__init__(shape, **params)  # sets self.shape and self.alpha

        def select(self, step):
            return step.logits            # scores [heads, cols]: kvlens selects by them

        def observe(self, obs):          # optional: after the attention of (step, layer)
            ...

`needs` names what kvlens computes for the policy: "logits" (step.logits, the true pre-softmax
attention logits), "probabilities" (observe() gets them), "predictor" (step.predictor_scores,
the model's TokenButler predictor), "cache" (step.keys / step.values), "previous_visible"
(step.previous_visible) and "eligible" (step.eligible, to mark evicted columns).

`select(step)` returns one of: an array of scores [heads, cols] (NumPy or torch); `step.scores`
written in place and `kvlens.SCORES`; `kvlens.visible(mask)` (a bool [heads, cols] set) or
`step.visible` written in place and `kvlens.VISIBLE`; `kvlens.DENSE` (every token this layer).
A buffer the policy reads (step.scores, step.eligible) it writes whole, every candidate column:
kvlens does not clear them between steps; one it leaves alone gets the defaults (scores 0,
eligible 1). `step.recent`, `step.page_size` (Quest's pages) and `step.shared` (one set for the
whole layer, ranked by the scores summed over the heads) shape a SCORES answer.
The step's arrays are views over kvlens' buffers, valid during the call only (copy to keep).
With `tensors = "torch"` they are torch tensors (on the GPU through DLPack, on the session's
stream); otherwise NumPy arrays (on a CUDA session kvlens then copies them to the host).
"""

import inspect
import math
import sys
from collections import namedtuple

DENSE, SCORES, VISIBLE = 0, 1, 2

ModelShape = namedtuple(
    "ModelShape",
    "layers heads kv_heads head_dim hidden_size max_positions has_predictor memory")
ModelShape.__doc__ = "The model a policy instance runs on (memory: 'host' or 'cuda')."


class Param:
    """A policy knob: type, default, inclusive range, one-line description."""
    type = "float"

    def __init__(self, default, min=-math.inf, max=math.inf, help="", choices=None):
        self.default, self.min, self.max, self.help = default, min, max, help
        self.choices = list(choices or [])


class Float(Param):
    type = "float"


class Int(Param):
    type = "int"


class Bool(Param):
    type = "bool"

    def __init__(self, default, help=""):
        super().__init__(bool(default), 0, 1, help)


class Choice(Param):
    type = "choice"

    def __init__(self, default, choices, help=""):
        super().__init__(default, -math.inf, math.inf, help, choices)


class Visible:
    """select()'s answer as a visible set: bool [heads, cols]."""
    __slots__ = ("mask",)

    def __init__(self, mask):
        self.mask = mask


def visible(mask):
    """Wraps a bool [heads, cols] mask as select()'s answer (kvlens checks it)."""
    return Visible(mask)


class Policy:
    """Base class of Python policies (see the kvlens.policy module's documentation)."""
    name = None
    family = "python"
    params = {}
    needs = set()
    tensors = "numpy"
    predicts_logits = False

    def __init__(self, shape, **params):
        self.shape = shape
        for key, value in params.items():
            setattr(self, key, value)

    def select(self, step):
        raise NotImplementedError(f"{type(self).__name__}.select(step)")


def _param_spec(name, spec):
    if not isinstance(spec, Param):
        if isinstance(spec, bool):
            spec = Bool(spec)
        elif isinstance(spec, int):
            spec = Int(spec)
        elif isinstance(spec, float):
            spec = Float(spec)
        else:
            raise TypeError(f"parameter {name!r}: a kvlens.Float/Int/Bool/Choice or a number")
    default = spec.default
    if spec.type == "choice":
        if default not in spec.choices:
            raise ValueError(f"parameter {name!r}: default {default!r} not in {spec.choices}")
        default = spec.choices.index(default)
    return (name, spec.type, spec.help or name, float(default), float(spec.min),
            float(spec.max), [str(c) for c in spec.choices])


def _describe(cls):
    """The class as the C contract describes a policy (used by the registration)."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise TypeError(f"{cls!r} is not a kvlens.Policy subclass")
    rule = inspect.cleandoc(cls.__doc__ or "")
    if not rule or cls.__doc__ == Policy.__doc__:
        raise ValueError(f"{cls.__qualname__}: a policy's docstring states its rule; it has none")
    if cls.select is Policy.select:
        raise ValueError(f"{cls.__qualname__}: defines no select(step)")
    name = cls.name or cls.__name__.lower()
    source_file = cls.__dict__.get("_kvlens_file", "")  # set by load_policy_file
    if not source_file:
        try:
            source_file = inspect.getsourcefile(cls) or ""
        except (TypeError, OSError):  # defined in an interactive session
            pass
    module = cls.__module__
    source = f"python:{source_file or module}:{cls.__qualname__}"
    if cls.tensors not in ("numpy", "torch"):
        raise ValueError(f"{cls.__qualname__}.tensors: 'numpy' or 'torch'")
    return {
        "name": name,
        "family": cls.family or "python",
        "rule": " ".join(rule.split("\n\n")[0].split()) if rule else "",
        "params": [_param_spec(k, v) for k, v in dict(cls.params).items()],
        "needs": sorted(set(cls.needs)),
        "torch": cls.tensors == "torch",
        "predicts_logits": bool(cls.predicts_logits),
        "has_observe": callable(getattr(cls, "observe", None)),
        "source": source,
    }


def _answer(step, result):
    """select()'s answer that is not a decision constant: scores or a visible set."""
    if isinstance(result, Visible):
        target, value = step.visible, result.mask
        decision = VISIBLE
    elif result is None:
        raise TypeError("select() returned None: return scores, kvlens.visible(mask), "
                        "kvlens.SCORES, kvlens.VISIBLE or kvlens.DENSE")
    else:
        target, value = step.scores, result
        decision = SCORES
    if hasattr(target, "copy_"):  # torch
        target.copy_(value.to(target.dtype) if hasattr(value, "to") else
                     __import__("torch").as_tensor(value, device=target.device))
    else:
        if hasattr(value, "detach"):  # a torch tensor for a NumPy policy
            value = value.detach().cpu().numpy()
        target[...] = value
    return decision


_streams = {}


def _call_on_stream(method, view, stream, answer=None):
    """Calls method(view) with torch's current stream set to the session's (CUDA), and, for a
    select(), turns its result into the answer on that stream too: the copy of a returned tensor
    into the answer's buffers must be ordered before kvlens's own ops read them."""
    def call():
        result = method(view)
        if answer is None or isinstance(result, int):
            return result
        return answer(view, result)
    if not stream:  # the legacy default stream: torch's own default
        return call()
    import torch
    s = _streams.get(stream)
    if s is None:
        s = _streams[stream] = torch.cuda.ExternalStream(stream)
    with torch.cuda.stream(s):
        return call()


def policy_classes(namespace):
    """The kvlens.Policy subclasses a module (or dict) defines itself, in definition order (a
    base class without its own select() is left out)."""
    items = namespace.items() if isinstance(namespace, dict) else vars(namespace).items()
    module_name = namespace.get("__name__") if isinstance(namespace, dict) else namespace.__name__
    return [v for _, v in items
            if isinstance(v, type) and issubclass(v, Policy) and v is not Policy
            and v.__module__ == module_name and v.select is not Policy.select]

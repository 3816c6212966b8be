"""The operand check every rung of the ``moe`` op shares (errors name the argument)."""
from __future__ import annotations

from ... import validate
from ..routing import checked_top_k

def moe_operands(x, router, gate, up, down, top_k, dtypes, router_dtypes=None) -> None:
    """x (T, dim), router (E, dim), gate and up (E, dim, hidden), down (E, hidden, dim),
    one device, one dtype of ``dtypes`` (the router's any of ``router_dtypes`` instead, where
    given: the layers compute its logits in float32 whatever its weight's dtype, so under
    autocast an fp32 router beside bf16 experts is no mismatch), 1 <= top_k <= E."""
    validate.tensor("x", x, ndim=2, allow_empty=True)
    validate.tensor("router", router, ndim=2)
    for name, w in (("gate", gate), ("up", up), ("down", down)):
        validate.tensor(name, w, ndim=3)
    validate.same_device(x=x, router=router, gate=gate, up=up, down=down)
    if router_dtypes is None:
        validate.same_dtype(x=x, router=router, gate=gate, up=up, down=down)
    else:
        validate.same_dtype(x=x, gate=gate, up=up, down=down)
        validate.tensor("router", router, dtypes=router_dtypes)
    validate.tensor("x", x, dtypes=dtypes, allow_empty=True)
    (e, dim), hidden = router.shape, gate.shape[2]
    expected = {"x": (x.shape[0], dim), "gate": (e, dim, hidden), "up": (e, dim, hidden),
                "down": (e, hidden, dim)}
    for name, t in (("x", x), ("gate", gate), ("up", up), ("down", down)):
        if tuple(t.shape) != expected[name]:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; with router (E, dim) = "
                             f"{tuple(router.shape)} and hidden {hidden} it must be "
                             f"{expected[name]}")
    checked_top_k(top_k, e)

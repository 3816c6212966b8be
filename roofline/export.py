"""Write a chart to PNG or SVG without a browser, through vl-convert.

Notebooks run headless in CI and on Binder, where no browser is available to render Vega;
vl-convert embeds the Vega runtime, so the files come out the same everywhere.
"""

from pathlib import Path

import altair as alt
import vl_convert

_FORMATS = (".png", ".svg")


def _vl_version():
    """The Vega-Lite version altair wrote the spec for, when vl-convert bundles it."""
    version = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return version if version in vl_convert.get_vegalite_versions() else None


def save_chart(chart, path, scale=2.0) -> Path:
    """Save ``chart`` to ``path``; the suffix (.png or .svg) picks the format."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise ValueError(f"{path}: unsupported format {suffix!r}; use one of {_FORMATS}")
    spec = chart.to_dict()
    if suffix == ".svg":
        path.write_text(vl_convert.vegalite_to_svg(spec, vl_version=_vl_version()),
                        encoding="utf-8")
    else:
        path.write_bytes(vl_convert.vegalite_to_png(spec, vl_version=_vl_version(),
                                                    scale=scale))
    return path

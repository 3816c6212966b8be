"""torch.compile's caches are keyed by this package's source (kernels/compile_cache.py): a graph
compiled against one version of an op's fake is not reused after the source changes (inductor's
own key does not cover a custom op's fake: the attention backward's old contiguous fakes, reused
from a machine's cache, failed their stride asserts against the new ops)."""
from __future__ import annotations

import shutil

import torch
import torch._dynamo

import kernels
from kernels import compile_cache


def test_import_tags_the_caches_with_the_source_digest():
    assert f"[kernels {compile_cache.digest()}]" in torch.compiler.config.cache_key_tag


def test_the_digest_follows_every_file_name_and_byte(tmp_path):
    for name in ("a.py", "sub/b.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    before = compile_cache.digest(tmp_path)
    (tmp_path / "sub/b.py").write_text("x = 2\n")
    changed = compile_cache.digest(tmp_path)
    shutil.move(tmp_path / "sub/b.py", tmp_path / "sub/c.py")
    assert len({before, changed, compile_cache.digest(tmp_path)}) == 3


def test_a_users_tag_stays_in_front_and_the_tag_is_added_once():
    with torch.compiler.config.patch(cache_key_tag="mine"):
        ours = compile_cache.tag()
        compile_cache.tag()
        assert torch.compiler.config.cache_key_tag == "mine" + ours


def test_another_tag_misses_the_graph_cache(tmp_path, monkeypatch):
    """The tag is in inductor's key: the same graph compiled again hits, under another tag misses.
    The graph is the custom op alone (its fake is what a stale cache entry gets wrong): any
    torch op beside it would add a C++ kernel, seconds of compiler per miss, to no purpose."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    a, b = torch.randn(16, 16), torch.randn(16, 16)

    def compiled_once() -> tuple[int, int]:
        """(graph-cache hits, misses) of compiling one graph afresh."""
        counters = torch._dynamo.utils.counters["inductor"]
        before = counters["fxgraph_cache_hit"], counters["fxgraph_cache_miss"]
        torch._dynamo.reset()
        torch.compile(lambda x, y: kernels.matmul(x, y))(a, b)
        counters = torch._dynamo.utils.counters["inductor"]
        return counters["fxgraph_cache_hit"] - before[0], counters["fxgraph_cache_miss"] - before[1]

    with torch._inductor.config.patch(fx_graph_cache=True, fx_graph_remote_cache=False):
        assert compiled_once() == (0, 1)    # a cold folder
        assert compiled_once() == (1, 0)    # the same source: reused
        with torch.compiler.config.patch(cache_key_tag=torch.compiler.config.cache_key_tag + "[kernels other]"):
            assert compiled_once() == (0, 1)  # another source: compiled again

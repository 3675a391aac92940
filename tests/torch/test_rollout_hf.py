"""docs/rl.md's Hugging Face block run as written: a tiny Llama fed a rollout's micro-batches
through ``hf_inputs``; every sample's old log-probs, put back as ``[B, W]``, are its own run
alone. And every relative link of docs/rl.md resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch.nn")
transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
RL_MD = ROOT / "docs" / "rl.md"


def hf_block() -> str:
    text = RL_MD.read_text()
    section = text[text.index("### A Hugging Face model") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def verl_batch() -> dict[str, torch.Tensor]:
    """Prompts left-padded to 5 columns, responses right-padded in 6 after them."""
    g = torch.Generator().manual_seed(3)
    prompts, responses = [3, 5, 1, 4, 2, 5, 3], [6, 2, 4, 1, 6, 3, 5]
    b, p, w = len(prompts), 5, 6
    ids, mask = torch.zeros(b, p + w, dtype=torch.long), torch.zeros(b, p + w, dtype=torch.long)
    for i, (a, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, p - a : p + r] = torch.randint(1, 100, (a + r,), generator=g)
        mask[i, p - a : p + r] = 1
    return {"input_ids": ids, "attention_mask": mask, "responses": ids[:, p:].clone(),
            "response_mask": mask[:, p:].clone()}  # fmt: skip


@pytest.fixture
def one_process(tmp_path: Path):  # gather_outputs' all-reduce, over a group of one
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)  # fmt: skip
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_docs_hf_block_gives_each_samples_own_log_probs(attn: str, one_process: None) -> None:
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   max_position_embeddings=64, attn_implementation=attn)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    batch = verl_batch()
    scope = {"batch": batch, "model": model, "world": 1, "rank": 0, "device": "cpu"}
    exec(compile(hf_block(), str(RL_MD), "exec"), scope)
    old = scope["old"]
    assert old.shape == batch["responses"].shape
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        for i in range(len(mask)):
            ids = batch["input_ids"][i][mask[i]][None]
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
            r = int(batch["response_mask"][i].sum())
            assert torch.allclose(old[i, :r], lp[-r:], atol=1e-5), i
            assert (old[i, r:] == 0).all()


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page: its headings as GitHub slugs them, and ``<a id>``s."""
    text = page.read_text()
    heads = re.findall(r"^#+ (.+)$", text, re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}
    return slugs | set(re.findall(r'<a id="([^"]+)"', text))


def test_every_relative_link_of_the_rl_page_resolves() -> None:
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", RL_MD.read_text()):
        if "://" in target:
            continue
        page = RL_MD.parent / target if target else RL_MD
        if not page.exists() or (anchor and page.suffix == ".md" and anchor not in anchors(page)):
            broken.append(f"{target}#{anchor}" if anchor else target)
    assert not broken, broken

"""nvio.safetensors.load_model_folder on a Hugging Face model folder that transformers writes in
the test (a tiny Llama with random weights, save_pretrained with a small max_shard_size, so several
shards): the tensors are bit-identical to the model's, all shards are read by one read batch, and a
model built from them gives identical outputs. Also the single-file folder and damaged indexes."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import nvio  # noqa: E402
import nvio.safetensors as st  # noqa: E402


def _raw(t):
    flat = t.detach().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""


def _tiny_model(seed: int, tie: bool = False):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=tie)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    model = _tiny_model(0)
    folder = tmp_path_factory.mktemp("model")
    model.save_pretrained(folder, max_shard_size="20KB")
    return model, folder


def test_sharded_folder_loads_bit_identical_in_one_batch(sharded, monkeypatch):
    model, folder = sharded
    shards = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    assert len(shards) >= 3
    # Every shard's data is read by one read_batch: count the calls and their extents.
    core = type(nvio.safetensors._folder.shared_handle()._core)
    calls = []
    real = core.read_batch

    def counting(self, items, *args, **kwargs):
        calls.append({item[3] for item in items})
        return real(self, items, *args, **kwargs)

    monkeypatch.setattr(core, "read_batch", counting)
    loaded = st.load_model_folder(folder)
    monkeypatch.undo()
    assert len(calls) == 1 and len(calls[0]) == len(shards)

    expected = model.state_dict()
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(loaded) == set(weight_map) == set(expected)
    for name, t in loaded.items():
        assert t.dtype == expected[name].dtype and t.shape == expected[name].shape, name
        assert _raw(t) == _raw(expected[name]), name

    # A model built from them (another seed's weights, replaced) computes the same outputs.
    rebuilt = _tiny_model(1)
    rebuilt.load_state_dict(loaded)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(rebuilt(ids).logits, model(ids).logits)


def test_tied_single_file_folder(tmp_path):
    # Tied embeddings: save_pretrained drops the tied copy; tie_weights() restores it.
    model = _tiny_model(2, tie=True)
    model.save_pretrained(tmp_path)
    assert "model.safetensors" in os.listdir(tmp_path)
    loaded = st.load_model_folder(tmp_path)
    rebuilt = _tiny_model(3, tie=True)
    missing, unexpected = rebuilt.load_state_dict(loaded, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    rebuilt.tie_weights()
    ids = torch.arange(12).reshape(1, 12)
    with torch.no_grad():
        assert torch.equal(rebuilt(ids).logits, model(ids).logits)


def test_damaged_folders_are_refused(sharded, tmp_path):
    _, folder = sharded
    with pytest.raises(nvio.FileNotFound, match="model.safetensors.index.json"):
        st.load_model_folder(tmp_path)
    for name in os.listdir(folder):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    index = tmp_path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    name, shard = next(iter(data["weight_map"].items()))
    other = next(s for s in data["weight_map"].values() if s != shard)
    data["weight_map"][name] = other
    index.write_text(json.dumps(data))
    with pytest.raises(nvio.FormatError, match="does not hold it"):
        st.load_model_folder(tmp_path)
    data["weight_map"][name] = "../elsewhere.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(nvio.FormatError, match="outside"):
        st.load_model_folder(tmp_path)
    index.write_text("{not json")
    with pytest.raises(nvio.FormatError, match="cannot read the index"):
        st.load_model_folder(tmp_path)

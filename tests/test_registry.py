"""The drafter registry: one table of every kind a user can name, its factory, and the help the CLI shows."""

import pytest

from specdec.drafters import DEFAULT_DRAFT, DRAFT_KINDS, LookupDrafter, NoDrafter, draft_help, make_drafter
from specdec.drafters.registry import find_kind
from specdec.models.loader import LoadedModel

KINDS = ["auto", "lookup", "none", "head:PATH[:MIN_CONF]", "lookup+head:PATH[:MIN_CONF]", "self-int8", "self-int4",
         "self-bf16", "oracle:ALPHA[:DRAFT]", "megakernel:MODEL", "intersect:MODEL", "MODEL"]


def test_the_table_lists_every_kind_once_with_its_help():
    syntaxes = [kind.syntax for kind in DRAFT_KINDS]
    assert set(KINDS) <= set(syntaxes) and len(syntaxes) == len(set(syntaxes))
    assert syntaxes[-1] == "MODEL"  # the catch-all comes last
    assert all(kind.help and "\n" not in kind.help and "%" not in kind.help for kind in DRAFT_KINDS)


@pytest.mark.parametrize("spec, syntax, arg", [
    ("lookup", "lookup", ""),
    ("auto", "auto", ""),
    ("self-int4-dequant", "self-int4-dequant", ""),
    ("head:/x/h.safetensors:0.3", "head:PATH[:MIN_CONF]", "/x/h.safetensors:0.3"),
    ("lookup+head:h.safetensors", "lookup+head:PATH[:MIN_CONF]", "h.safetensors"),
    ("megakernel:default", "megakernel:MODEL", "default"),
    ("intersect:./qwen", "intersect:MODEL", "./qwen"),
    ("HuggingFaceTB/SmolLM2-135M", "MODEL", "HuggingFaceTB/SmolLM2-135M"),
    ("C:/models/draft", "MODEL", "C:/models/draft"),  # an unknown prefix is part of a path
])
def test_a_spec_finds_its_kind(spec, syntax, arg):
    kind, found = find_kind(spec)
    assert (kind.syntax, found) == (syntax, arg)


def test_named_kinds_build_their_drafters(tiny_target):
    loaded = LoadedModel(tiny_target, tokenizer=None, name="tiny")
    assert isinstance(make_drafter("none", loaded), NoDrafter)
    assert isinstance(make_drafter("lookup", loaded), LookupDrafter)
    assert isinstance(make_drafter("auto", loaded), LookupDrafter)  # no shipped head was made for this target


def test_a_model_of_any_tokenizer_may_draft():
    """The MODEL kind refuses no tokenizer: another's drafts are re-encoded (docs/drafts.md)."""
    kinds = {kind.syntax: kind.help for kind in DRAFT_KINDS}
    assert "any model" in kinds["MODEL"] and "re-encoded" in kinds["MODEL"]
    assert "share" in kinds["intersect:MODEL"]


def test_cli_draft_help_comes_from_the_table_and_generate_and_serve_share_the_default():
    from specdec.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for command in ("generate", "serve"):
        draft = next(a for a in sub.choices[command]._actions if a.dest == "draft")
        assert draft.default == DEFAULT_DRAFT == "auto"
        assert draft.help.startswith("draft: " + draft_help())
    help_text = " ".join(sub.choices["generate"].format_help().split())
    for kind in DRAFT_KINDS:
        assert f"`{kind.syntax}`" in help_text.replace("- ", "-")  # argparse may wrap at a hyphen


def test_drafter_modules_register_nothing_on_import():
    """The table is a tuple built in registry.py: no drafter module writes itself into a registry."""
    import importlib

    from specdec.drafters import registry

    assert isinstance(registry.DRAFT_KINDS, tuple)
    for name in ("quantized", "oracle", "combined", "head", "lookup", "model", "none"):
        module = importlib.import_module(f"specdec.drafters.{name}")
        assert not hasattr(module, "_register") and "registry" not in vars(module)

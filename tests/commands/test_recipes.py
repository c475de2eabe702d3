"""Recipe commands (runner recipes list / show / copy / validate), in-process."""

from __future__ import annotations

import pytest

from runner.commands import recipes

BROKEN = "# @package _global_\n# A typo in a target.\nmodel:\n  _target_: runner.models.SeqTransformr\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    return tmp_path


def test_list_names_every_recipe_and_where_it_is(project, capsys):
    """Each recipe with its description line and where it is (a folder, or built-in)."""
    (project / "recipes" / "mine.yaml").write_text("# @package _global_\n# Mine, to try things.\n")
    recipes.main(["list"])
    out = capsys.readouterr().out
    assert any(line.startswith("mine ") and line.endswith(": Mine, to try things.") for line in out.splitlines())
    assert any(line.startswith("reverse ") and "built-in: Reverse sequences of 12 random digits" in line
               for line in out.splitlines())
    assert "none of your own yet" not in out


def test_list_without_own_recipes_says_where_they_go(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RUNNER_RECIPE_PATH", raising=False)
    recipes.main(["list"])
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (f"(none of your own yet: a recipe of yours goes in {tmp_path.resolve() / 'recipes'}, or in a "
                    "folder on $RUNNER_RECIPE_PATH; start from a copy: runner recipes copy digits_mlp my_digits)")


def test_show_prints_the_whole_composed_config(project, capsys):
    recipes.main(["show", "digits_mlp", "optimizer.lr=0.01"])
    out = capsys.readouterr().out
    assert "  _target_: runner.models.MLP\n" in out and "  lr: 0.01\n" in out and "hidden:\n  - 512\n" in out


def test_show_names_the_values_still_to_set(project, capsys):
    """`recipes show` of a recipe with ??? values prints it and names them; once set, none is named."""
    recipes.main(["copy", "tabular_csv", "mine"])  # data.train is ??? until the user sets it
    capsys.readouterr()
    recipes.main(["show", "mine"])
    out = capsys.readouterr().out
    assert "  train: ???\n" in out and "_target_: runner.data.local_files" in out
    assert out.rstrip().endswith("# still to set (???): data.train; e.g. runner recipe=mine data.train=...")
    recipes.main(["show", "mine", "data.train=table.csv"])  # set: resolved as before, nothing left to name
    out = capsys.readouterr().out
    assert "  train: table.csv\n" in out and "still to set" not in out


def test_copy_writes_to_recipes_and_never_overwrites(project, capsys):
    """The copy is an editable recipe in the project's recipes/ folder, its header line naming its origin."""
    recipes.main(["copy", "digits_mlp", "my_digits"])
    copied = project / "recipes" / "my_digits.yaml"
    original = recipes.available()["digits_mlp"].path.read_text().splitlines(keepends=True)
    # The same recipe, with a header line that names the copy and where it came from.
    assert copied.read_text().splitlines(keepends=True) == [
        original[0], "# Recipe my_digits, copied from the built-in recipe digits_mlp; run it: runner recipe=my_digits\n",
        *original[1:]]
    assert "runner recipe=my_digits" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        recipes.main(["copy", "digits_mlp", "my_digits"])
    assert refused.value.code == 1 and "exists already" in capsys.readouterr().err


def test_validate_builds_all_and_fails_like_a_run(project, capsys):
    """`recipes validate` builds everything without training (no run dir) and fails as a run would."""
    recipes.main(["validate", "reverse", "data.num_train=64", "data.num_validation=32"])
    out = capsys.readouterr().out
    assert "recipe reverse: valid." in out and "parameters" in out and "batch: 64 global per optimizer step" in out
    assert not (project / "outputs").exists()  # nothing written: no run dir
    (project / "recipes" / "broken.yaml").write_text(BROKEN)
    with pytest.raises(SystemExit) as failed:
        recipes.main(["validate", "broken"])
    assert failed.value.code == 1
    assert "model._target_: cannot import 'runner.models.SeqTransformr'" in capsys.readouterr().err


def test_validate_shows_no_progress_bars_of_datasets(project, capsys):
    """Building the data (a new file: datasets generates its split, then maps the tokenizer over it) prints the
    verdict only, without datasets' "Generating train split" and "Map" bars."""
    import uuid

    import matrix_data

    files = matrix_data.write(project)
    texts = project / files["text_classification"]
    texts.write_text(texts.read_text() + f"a new row so that nothing is cached {uuid.uuid4().hex},0\n")
    capsys.readouterr()  # what writing the files printed (images.parquet is written through datasets)
    recipes.main(["validate", "text_classification", f"data.train={texts}"])
    captured = capsys.readouterr()
    assert "recipe text_classification: valid." in captured.out
    assert "Generating" not in captured.err and "Map" not in captured.err, captured.err


def test_an_unknown_recipe_lists_the_ones_there_are(project, capsys):
    with pytest.raises(SystemExit):
        recipes.main(["show", "revers"])
    assert "'revers' is not a recipe; the recipes are digits_cnn" in capsys.readouterr().err


def test_a_recipe_that_is_not_yaml_is_one_paragraph_naming_its_line(project, capsys):
    """A recipe file that does not parse: validate, show and plan name the file, the line and the problem, and print
    no traceback (as a run does)."""
    from runner.commands import plan

    broken = project / "recipes" / "indented.yaml"
    broken.write_text("# @package _global_\ntrainer:\n  max_epochs: 2\n batch_size: 8\n")
    for command in (lambda: recipes.main(["validate", "indented"]), lambda: recipes.main(["show", "indented"]),
                    lambda: plan.main(["recipe=indented"])):
        with pytest.raises(SystemExit) as failed:
            command()
        err = capsys.readouterr().err
        assert failed.value.code == 1
        assert f"{broken}: is not valid YAML, line 4, column 2: " in err and "nothing was run" in err, err
        assert "Traceback" not in err


@pytest.mark.parametrize("name", ["sub/dir", "../../outside", ""])
def test_copy_refuses_a_name_that_is_not_a_recipe_name(project, capsys, name):
    """A copy's name becomes recipes/<name>.yaml and recipe=<name>: a path would land elsewhere, or not be found."""
    with pytest.raises(SystemExit) as refused:
        recipes.main(["copy", "digits_mlp", name] if name else ["copy", "digits_mlp", "a b"])
    assert refused.value.code == 1
    assert "cannot name a recipe in recipes/: use letters, digits, _ and -" in capsys.readouterr().err
    assert list((project / "recipes").iterdir()) == [] and not (project.parent / "outside.yaml").exists()

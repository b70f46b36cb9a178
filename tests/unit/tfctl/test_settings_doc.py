from pathlib import Path

import pytest
from tfctl.main import main
from tfctl.settings_doc import BEGIN_MARKER, END_MARKER, rewrite_readme, setting_rows

REPOSITORY = Path(__file__).resolve().parents[3]


def test_the_readme_configuration_table_is_up_to_date() -> None:
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    assert rewrite_readme(readme) == readme, "run `tfctl config doc` and commit README.md"


def test_every_service_setting_has_a_row_with_its_environment_variable() -> None:
    variables = {row.variable for row in setting_rows()}
    expected = {"TF_NATS_URL", "TF_DATABASE_URL", "TF_CONFIG_FILE", "TF_API_TOKEN", "TF_PORT"}
    expected |= {"TF_TLS_CERT_FILE", "TF_FAKE_GPUS", "TF_SCHEDULER_QUOTA_FILE", "TF_STATE_DIR"}
    assert expected <= variables


def test_a_setting_shared_by_services_lists_each_of_them_once() -> None:
    port = next(row for row in setting_rows() if row.variable == "TF_PORT")
    assert port.used_by.split(", ") == ["webhook", "scheduler", "defrag-planner", "node-agent", "metrics"]


def test_check_fails_on_a_stale_readme_and_doc_repairs_it(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{BEGIN_MARKER}\n| stale |\n{END_MARKER}\noutro\n", encoding="utf-8")
    assert main(["config", "doc", "--readme", str(readme), "--check"]) == 1
    assert main(["config", "doc", "--readme", str(readme)]) == 0
    assert main(["config", "doc", "--readme", str(readme), "--check"]) == 0
    text = readme.read_text(encoding="utf-8")
    assert "| `TF_NATS_URL` |" in text
    assert text.startswith("intro\n")
    assert text.endswith("outro\n")


def test_a_readme_without_markers_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n", encoding="utf-8")
    assert main(["config", "doc", "--readme", str(readme)]) == 2
    assert "lacks the markers" in capsys.readouterr().err

"""Loading runbook files (bot.runbooks.loading): a valid runbook loads, and every problem names the
file, the line and the field (unknown actions with suggestions, unknown fields, bad semver,
duplicate step ids and YAML keys, malformed YAML, templates naming unknown parameters, wrong
``with:`` arguments, bad checks and parameters, duplicate runbook names); the content hash;
and Hypothesis fuzzing that the loader only ever raises RunbookError.
"""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.actions import StrictArguments
from adapters.host import HostRunArguments
from adapters.notify import NotifyArguments
from bot.runbooks.loading import RunbookError, load_all, load_file, load_text

ROOT = Path(__file__).resolve().parents[3]
SELFTEST = ROOT / "runbooks" / "selftest.yaml"
FILE = Path("drain.yaml")


class DrainArguments(StrictArguments):
    nodes: str
    reason: str


class NodesArguments(StrictArguments):
    nodes: str


class K8sDrainArguments(StrictArguments):
    node: str
    timeout: float = 3600.0


CATALOGUE: dict[str, type[StrictArguments]] = {
    "slurm.drain": DrainArguments,
    "slurm.resume": NodesArguments,
    "k8s.drain": K8sDrainArguments,
    "chat.notify": NotifyArguments,
    "host.run": HostRunArguments,
}

DRAIN = textwrap.dedent(
    """\
    name: drain-node
    version: 1.2.0
    summary: Drain a GPU node.
    risk: medium
    params:
      node: {type: node, required: true}
      reason: {type: text, max_length: 200, required: true}
      timeout: {type: duration, default: 2h}
    locks: ["node:{{ node }}"]
    approval: {required: 1, approvers: ["group:gpu-leads"], expires: 30m}
    pre_checks:
      - name: no other maintenance
        promql: 'sum(slurm_node_maintenance{node="{{ node }}"}) or vector(0)'
        expect: "== 0"
      - name: capacity
        capacity: {pool_of: "{{ node }}", min_free_gpus_after: 8}
    steps:
      - id: slurm-drain
        action: slurm.drain
        with: {nodes: "{{ node }}", reason: "{{ reason }}"}
        undo: {action: slurm.resume, with: {nodes: "{{ node }}"}}
      - id: k8s-drain
        action: k8s.drain
        when: "{{ node in kubernetes }}"
        with: {node: "{{ node }}", timeout: "{{ timeout }}"}
    post_checks:
      - name: idle
        promql: 'max(DCGM_FI_DEV_GPU_UTIL{Hostname="{{ node }}"})'
        expect: "< 5"
        for: 1m
    """
)


def load(text: str) -> Any:
    return load_text(text, FILE, CATALOGUE)


def problems(text: str) -> list[str]:
    with pytest.raises(RunbookError) as caught:
        load(text)
    return caught.value.problems


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line containing ``needle``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in the text")


def only(found: list[str]) -> str:
    assert len(found) == 1, found
    return found[0]


# --- a valid runbook ----------------------------------------------------------


def test_valid_runbook_loads() -> None:
    loaded = load(DRAIN)
    assert loaded.name == "drain-node"
    assert loaded.runbook.version == "1.2.0"
    assert [s.id for s in loaded.runbook.steps] == ["slurm-drain", "k8s-drain"]
    assert loaded.runbook.steps[0].undo is not None
    assert loaded.runbook.post_checks[0].for_ == "1m"
    assert loaded.path == FILE
    assert loaded.source == DRAIN
    assert len(loaded.content_hash) == 64


def test_shipped_selftest_runbook_loads() -> None:
    loaded = load_file(SELFTEST, CATALOGUE)
    assert loaded.name == "selftest"


# --- problems name file, line and field --------------------------------------------


def test_unknown_action_suggests_the_close_one() -> None:
    text = DRAIN.replace("action: slurm.drain", "action: slurm.drian")
    problem = only(problems(text))
    line = line_of(text, "slurm.drian")
    assert problem == (
        f'{FILE}:{line}: steps[0].action: unknown action "slurm.drian" '
        '(did you mean "slurm.drain"?)'
    )


def test_unknown_action_without_a_close_one_has_no_suggestion() -> None:
    text = DRAIN.replace("action: slurm.drain", "action: zzz.qqq")
    problem = only(problems(text))
    assert problem.endswith('unknown action "zzz.qqq"')


def test_unknown_undo_action_is_reported_at_the_undo() -> None:
    text = DRAIN.replace("action: slurm.resume", "action: slurm.resme")
    problem = only(problems(text))
    assert f"{FILE}:{line_of(text, 'slurm.resme')}: steps[0].undo.action:" in problem
    assert '(did you mean "slurm.resume"?)' in problem


def test_unknown_top_level_field() -> None:
    text = DRAIN.replace("risk: medium", "risk: medium\nowner: team-gpu")
    assert only(problems(text)) == f"{FILE}:{line_of(text, 'owner:')}: owner: unknown field"


def test_unknown_step_field() -> None:
    text = DRAIN.replace("  - id: k8s-drain", "  - id: k8s-drain\n    retires: 3")
    assert only(problems(text)) == (
        f"{FILE}:{line_of(text, 'retires:')}: steps[1].retires: unknown field"
    )


@pytest.mark.parametrize("version", ["1.2", "v1.2.0", "01.2.0", "1.2.0.4", "latest"])
def test_bad_semver(version: str) -> None:
    text = DRAIN.replace("version: 1.2.0", f'version: "{version}"')
    problem = only(problems(text))
    assert problem.startswith(f"{FILE}:2: version: ")
    assert "not semver" in problem


def test_semver_with_prerelease_and_build_is_fine() -> None:
    assert load(DRAIN.replace("version: 1.2.0", "version: 1.2.0-rc.1+b7")).runbook.version


def test_version_with_a_trailing_newline_is_refused() -> None:
    text = DRAIN.replace("version: 1.2.0", 'version: "1.2.0\\n"')
    assert "not semver" in only(problems(text))


def test_name_with_a_trailing_newline_is_refused() -> None:
    text = DRAIN.replace("name: drain-node", 'name: "drain-node\\n"')
    assert only(problems(text)).startswith(f"{FILE}:1: name: ")


def test_duplicate_step_ids() -> None:
    text = DRAIN.replace("id: k8s-drain", "id: slurm-drain")
    problem = only(problems(text))
    assert problem.startswith(f"{FILE}:{line_of(text, 'steps:')}: steps: ")
    assert 'step id "slurm-drain" is used twice (steps[0] and steps[1])' in problem


def test_duplicate_yaml_keys_are_refused_with_the_line() -> None:
    text = DRAIN.replace("risk: medium", "risk: medium\nrisk: low")
    assert only(problems(text)) == (
        f'{FILE}:{line_of(text, "risk: low")}: "risk" appears twice in the same mapping'
    )


def test_duplicate_keys_in_a_flow_mapping() -> None:
    text = DRAIN.replace('reason: "{{ reason }}"}', 'reason: "{{ reason }}", nodes: x}')
    problem = only(problems(text))
    assert '"nodes" appears twice' in problem
    assert problem.startswith(f"{FILE}:{line_of(text, 'nodes: x')}:")


def test_malformed_yaml_reports_the_line() -> None:
    text = DRAIN.replace("risk: medium", "risk: [medium")
    problem = only(problems(text))
    assert problem.startswith(f"{FILE}:")
    assert "not valid YAML" in problem
    line = int(problem.split(":")[1])
    assert line_of(text, "risk: [medium") <= line <= line_of(text, "params:") + 1


def test_bad_indentation_reports_the_line() -> None:
    text = DRAIN.replace("  node: {type: node", " node: {type: node")
    problem = only(problems(text))
    assert "not valid YAML" in problem
    assert problem.startswith(f"{FILE}:{line_of(text, 'reason: {type: text')}:")


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_empty_file(text: str) -> None:
    assert only(problems(text)) == f"{FILE}: the file is empty"


@pytest.mark.parametrize("text", ["- a list\n", "just text\n", "42\n"])
def test_a_runbook_must_be_a_mapping(text: str) -> None:
    assert only(problems(text)) == f"{FILE}:1: a runbook file must be a mapping"


def test_several_documents_are_refused() -> None:
    assert "not valid YAML" in only(problems(DRAIN + "---\nname: other\n"))


def test_template_naming_an_unknown_parameter_suggests_one() -> None:
    text = DRAIN.replace('reason: "{{ reason }}"', 'reason: "{{ nod }} {{ reason }}"')
    problem = only(problems(text))
    assert problem == (
        f"{FILE}:{line_of(text, '{{ nod }}')}: steps[0].with.reason: "
        'template uses "nod", which is not a parameter (did you mean "node"?)'
    )


def test_template_in_a_lock_and_a_check_are_checked() -> None:
    text = DRAIN.replace('"node:{{ node }}"', '"node:{{ nodee }}"').replace(
        'Hostname="{{ node }}"', 'Hostname="{{ hostname }}"'
    )
    found = problems(text)
    assert len(found) == 2
    assert found[0].startswith(f"{FILE}:{line_of(text, 'locks:')}: locks[0]: ")
    assert '"nodee"' in found[0]
    assert found[1].startswith(f"{FILE}:{line_of(text, 'hostname')}: post_checks[0].promql: ")


def test_inventory_facts_and_loop_variables_are_allowed() -> None:
    text = DRAIN.replace(
        'reason: "{{ reason }}"',
        'reason: "{% for n in nodes %}{{ n }}{% endfor %} {{ slurm | length }} {{ reason }}"',
    )
    load(text)


def test_template_syntax_error_is_reported() -> None:
    text = DRAIN.replace('reason: "{{ reason }}"', 'reason: "{{ reason "')
    problem = only(problems(text))
    line = line_of(text, '{{ reason "')
    assert problem.startswith(f"{FILE}:{line}: steps[0].with.reason: ")


def test_when_naming_an_unknown_variable_fails() -> None:
    text = DRAIN.replace("{{ node in kubernetes }}", "{{ node in kubernets }}")
    problem = only(problems(text))
    assert problem.startswith(f"{FILE}:{line_of(text, 'when:')}: steps[1].when: ")
    assert '"kubernets", which is not a parameter (did you mean "kubernetes"?)' in problem


def test_when_without_braces_is_checked_too() -> None:
    assert load(DRAIN.replace('"{{ node in kubernetes }}"', "node in kubernetes"))
    text = DRAIN.replace('"{{ node in kubernetes }}"', "nod in kubernetes")
    assert '"nod"' in only(problems(text))


def test_when_must_be_one_expression() -> None:
    text = DRAIN.replace('"{{ node in kubernetes }}"', "'{{ node }} and {{ reason }}'")
    assert "one expression" in only(problems(text))


def test_unknown_with_key_suggests_the_argument() -> None:
    text = DRAIN.replace('reason: "{{ reason }}"', 'reasn: "{{ reason }}"')
    found = problems(text)
    line = line_of(text, "reasn")
    assert f'{FILE}:{line}: steps[0].with.reasn: slurm.drain takes no argument "reasn" ' \
        '(did you mean "reason"?)' in found
    assert f'{FILE}:{line}: steps[0].with: slurm.drain needs the argument "reason"' in found


def test_missing_required_argument() -> None:
    text = DRAIN.replace('with: {nodes: "{{ node }}"}', "with: {}")
    assert only(problems(text)) == (
        f'{FILE}:{line_of(text, "with: {}")}: steps[0].undo.with: '
        'slurm.resume needs the argument "nodes"'
    )


def test_literal_arguments_are_validated_against_the_action() -> None:
    text = DRAIN.replace(
        "post_checks:",
        "  - id: diag\n    action: host.run\n    with: {command: dcgm-diag, args: 5}\npost_checks:",
    )
    problem = only(problems(text))
    assert problem.startswith(f"{FILE}:{line_of(text, 'args: 5')}: steps[2].with.args: ")
    assert "valid list" in problem


def test_enum_without_choices() -> None:
    text = DRAIN.replace("timeout: {type: duration, default: 2h}",
                         "timeout: {type: duration, default: 2h}\n  pool: {type: enum}")
    assert only(problems(text)) == (
        f"{FILE}:{line_of(text, 'pool:')}: params.pool: an enum parameter needs choices"
    )


def test_unknown_parameter_type() -> None:
    text = DRAIN.replace("{type: duration, default: 2h}", "{type: seconds}")
    line = line_of(text, "seconds")
    assert only(problems(text)).startswith(f"{FILE}:{line}: params.timeout.type")


def test_bad_default_is_refused_at_load_time() -> None:
    text = DRAIN.replace("default: 2h", "default: 2 hours")
    problem = only(problems(text))
    assert problem.startswith(f"{FILE}:{line_of(text, '2 hours')}: params.timeout.default: ")
    assert "not a duration" in problem


def test_bad_pattern_is_refused() -> None:
    text = DRAIN.replace("max_length: 200,", "max_length: 200, pattern: '(',")
    assert "not a regular expression" in only(problems(text))


def test_check_with_two_kinds() -> None:
    text = DRAIN.replace('expect: "== 0"', 'expect: "== 0"\n    command: dcgm-diag')
    problem = only(problems(text))
    assert problem.startswith(f"{FILE}:{line_of(text, 'no other maintenance')}: pre_checks[0]: ")
    assert "exactly one of promql, command, capacity, alerts" in problem


def test_check_without_expect() -> None:
    text = DRAIN.replace('    expect: "< 5"\n', "")
    problem = only(problems(text))
    assert problem.startswith(f"{FILE}:{line_of(text, 'name: idle')}: post_checks[0]: ")
    assert "needs expect" in problem


def test_check_with_a_bad_expect() -> None:
    text = DRAIN.replace('expect: "< 5"', 'expect: "about 5"')
    assert only(problems(text)).startswith(
        f"{FILE}:{line_of(text, 'about 5')}: post_checks[0].expect: "
    )


def test_bad_duration_in_a_check() -> None:
    text = DRAIN.replace("for: 1m", "for: a minute")
    line = line_of(text, "a minute")
    assert only(problems(text)).startswith(f"{FILE}:{line}: post_checks[0].for")


def test_every_problem_is_reported_at_once() -> None:
    text = DRAIN.replace("action: slurm.drain", "action: slurm.drian").replace(
        "{{ node in kubernetes }}", "{{ nod in kubernetes }}"
    )
    assert len(problems(text)) == 2


@pytest.mark.parametrize(
    ("value", "kind"),
    [("2024-01-01", "date"), ("!!set {a, b}", "set"), ("!!binary aGVsbG8=", "bytes")],
)
def test_values_json_cannot_hold_are_refused(value: str, kind: str) -> None:
    text = DRAIN.replace("default: 2h", f"default: {value}")
    problem = only(problems(text))
    assert problem.startswith(f"{FILE}:{line_of(text, 'default:')}: params.timeout.default: ")
    assert f"a {kind} value is not allowed" in problem


def test_non_text_keys_are_refused() -> None:
    text = DRAIN.replace("pre_checks:\n", "pre_checks:\n  - name: x\n    capacity: {1: 2}\n")
    line = line_of(text, "{1: 2}")
    assert only(problems(text)) == (
        f"{FILE}:{line}: pre_checks[0].capacity: the key 1 must be text (quote it)"
    )


def test_recursive_alias_is_refused() -> None:
    text = DRAIN + "description: &loop [*loop]\n"
    assert "alias refers to a value that contains it" in only(problems(text))


def test_alias_expansion_is_bounded() -> None:
    bomb = "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * 9)}]\n" for i in range(8)
    )
    assert "too large" in only(problems(bomb))


def test_deep_nesting_is_refused() -> None:
    assert "nested" in only(problems("a: " + "[" * 2000 + "]" * 2000 + "\n"))
    assert "nested" in only(problems("a: " + "[" * 100 + "]" * 100 + "\n"))


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(RunbookError) as caught:
        load_file(tmp_path / "missing.yaml", CATALOGUE)
    assert "cannot read" in only(caught.value.problems)


# --- several files ------------------------------------------------------------------


def test_two_files_with_the_same_runbook_name(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(DRAIN)
    (tmp_path / "b.yml").write_text(DRAIN.replace("version: 1.2.0", "version: 1.3.0"))
    (tmp_path / "notes.txt").write_text("not a runbook")
    with pytest.raises(RunbookError) as caught:
        load_all([tmp_path], CATALOGUE)
    assert only(caught.value.problems) == (
        f'{tmp_path / "b.yml"}: runbook "drain-node" is also defined in {tmp_path / "a.yaml"}'
    )


def test_load_all_collects_the_problems_of_every_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(DRAIN.replace("slurm.drain", "slurm.drian"))
    (tmp_path / "b.yaml").write_text(DRAIN.replace("risk: medium", "risk: extreme"))
    (tmp_path / "c.yaml").write_text(DRAIN.replace("drain-node", "fine"))
    with pytest.raises(RunbookError) as caught:
        load_all([tmp_path], CATALOGUE)
    found = caught.value.problems
    assert len(found) == 2
    assert found[0].startswith(f"{tmp_path / 'a.yaml'}:")
    assert found[1].startswith(f"{tmp_path / 'b.yaml'}:")


def test_load_all_by_name(tmp_path: Path) -> None:
    (tmp_path / "drain.yaml").write_text(DRAIN)
    found = load_all([tmp_path, SELFTEST], CATALOGUE)
    assert sorted(found) == ["drain-node", "selftest"]


# --- content hash -----------------------------------------------------------------


def test_content_hash_ignores_comments_and_formatting() -> None:
    reformatted = yaml.safe_dump(yaml.safe_load(DRAIN), sort_keys=True, default_flow_style=False)
    commented = "# a comment\n" + DRAIN.replace("risk: medium", "risk:   medium   # why")
    hashes = {load(text).content_hash for text in (DRAIN, reformatted, commented)}
    assert len(hashes) == 1


def test_content_hash_changes_with_content() -> None:
    changed = DRAIN.replace("summary: Drain a GPU node.", "summary: Drain a GPU node!")
    assert load(DRAIN).content_hash != load(changed).content_hash


# --- fuzzing: only RunbookError, never another exception ---------------------------------

FUZZ = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def must_only_refuse(text: str) -> None:
    try:
        load_text(text, FILE, CATALOGUE)
    except RunbookError as exc:
        assert exc.problems
        assert all(isinstance(p, str) and p.startswith(str(FILE)) for p in exc.problems)


@FUZZ
@given(st.text())
def test_fuzz_arbitrary_text(text: str) -> None:
    must_only_refuse(text)


@FUZZ
@given(st.text(alphabet="abc:-[]{}&*!|>'\"#%@` \n\t0123456789.,?~"))
def test_fuzz_yaml_like_text(text: str) -> None:
    must_only_refuse(text)


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["{{ node }}", "{{ nod }}", "{{ ''.__class__ }}", "{%", "1.0.0", "2h"])
)
KEYS = st.sampled_from(
    ["name", "version", "summary", "risk", "params", "steps", "id", "action", "with", "when",
     "type", "undo", "expect", "promql", "default", "choices", "for", "x"]
) | st.text(max_size=8)
TREES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=30,
)


@FUZZ
@given(st.dictionaries(KEYS, TREES, max_size=8))
def test_fuzz_yaml_dumps_of_nested_data(data: dict[str, Any]) -> None:
    must_only_refuse(yaml.safe_dump(data))


SELFTEST_DATA: dict[str, Any] = yaml.safe_load(SELFTEST.read_text())


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [at] if at else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*at, index))
    return found


SELFTEST_PATHS = _paths(SELFTEST_DATA)


@FUZZ
@given(
    st.sampled_from(SELFTEST_PATHS),
    st.sampled_from(["drop", "rename", "retype"]),
    st.text(max_size=10),
    TREES,
)
def test_fuzz_mutations_of_the_selftest_runbook(
    path: tuple[Any, ...], how: str, new_name: str, new_value: Any
) -> None:
    data = copy.deepcopy(SELFTEST_DATA)
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if how == "drop":
        del parent[last]
    elif how == "rename" and isinstance(parent, dict):
        parent[new_name] = parent.pop(last)
    else:
        parent[last] = new_value
    must_only_refuse(yaml.safe_dump(data, sort_keys=False))


def test_selftest_mutation_harness_loads_the_unmutated_runbook() -> None:
    load_text(yaml.safe_dump(SELFTEST_DATA, sort_keys=False), FILE, CATALOGUE)

"""The data's class names a study keeps (``data_classes``): what is said when they change."""

from __future__ import annotations

import pytest

from hpsearch.search.data_classes import changed_classes, check_classes, stored_classes
from hpsearch.search.errors import ConfigError
from hpsearch.search.experiment import ExperimentDir


def test_changed_names_are_said_and_a_long_list_is_not_printed_whole(tmp_path):
    exp = ExperimentDir(tmp_path)
    check_classes(exp, ["cat", "dog"])  # recorded by the first session
    assert stored_classes(exp) == ["cat", "dog"] and changed_classes(exp, ["cat", "dog"]) is None
    with pytest.raises(ConfigError, match=r"\(gone: 'dog'; new: 'eel'\).* \(it had \['cat', 'dog'\], the data now "
                                          r"has \['cat', 'eel'\]\)"):
        check_classes(exp, ["cat", "eel"])
    assert "gone" not in changed_classes(exp, ["dog", "cat"]) and "their order" in changed_classes(exp, ["dog", "cat"])
    many = [f"n{index:05d}" for index in range(1000)]  # an ImageNet-sized list printed twice (audit 73)
    exp.data_json.write_text('{"classes": ' + str(many).replace("'", '"') + "}")
    said = changed_classes(exp, many[1:])
    assert "gone: 'n00000'" in said and "it had" not in said and len(said) < 400, said


def test_a_record_that_holds_no_mapping_is_no_record(tmp_path):
    exp = ExperimentDir(tmp_path)
    exp.data_json.write_text('["cat", "dog"]')  # a TypeError, raw (audit 73)
    assert stored_classes(exp) is None

"""The rejection-rule catalogue (kpool.rules.RULES; parity-contract.md §5): every check rejects
through a registered rule, every registered rule is used by a check and asserted by a bad-input
test, and the exceptions keep their rule and builtin bases."""
import pathlib
import pickle
import re

import pytest

from kpool import errors
from kpool.rules import RULES, reject

ROOT = pathlib.Path(__file__).resolve().parents[1]
REJECT_CALL = re.compile(r"""reject\(\s*["']([a-z0-9-]+)["']""")
# the test modules whose bad inputs assert ``rule == <name>`` (tests/rejection.py's assert_rejected)
BAD_INPUT_TESTS = ("test_validation.py", "test_write_rules.py", "test_aliasing.py", "test_arguments.py",
                   "test_backend.py")


def _check_sources() -> str:
    """Every kpool module; of kpool/rules.py only its helpers (not the RULES table itself)."""
    texts = []
    for path in sorted((ROOT / "kpool").rglob("*.py")):
        text = path.read_text()
        texts.append(text.split("def reject(", 1)[1] if path.name == "rules.py" else text)
    return "\n".join(texts)


def test_every_check_uses_a_registered_rule_and_every_rule_is_used():
    text = _check_sources()
    assert set(REJECT_CALL.findall(text)) - set(RULES) == set(), "reject() with a name missing from RULES"
    # a rule passed through a variable (a loop over similar checks) still appears quoted
    assert sorted(r for r in RULES if f'"{r}"' not in text) == [], "RULES entries that no check raises"


def test_every_rule_is_asserted_by_a_bad_input_test():
    text = "\n".join((ROOT / "tests" / name).read_text() for name in BAD_INPUT_TESTS)
    missing = sorted(r for r in RULES if f'"{r}"' not in text)
    assert missing == [], f"rules without a bad-input test: {missing}"


@pytest.mark.parametrize("rule", sorted(RULES))
def test_reject_raises_the_rules_class_with_its_name(rule):
    with pytest.raises(RULES[rule].error) as info:
        reject(rule, "bad")
    exc = info.value
    assert isinstance(exc, errors.KPoolError) and exc.rule == rule and str(exc) == "bad"
    assert isinstance(exc, (ValueError, TypeError, NotImplementedError))
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is type(exc) and again.rule == rule and str(again) == "bad"


def test_unknown_rule_is_a_programming_error():
    with pytest.raises(KeyError):
        reject("no-such-rule", "bad")


def test_error_classes_keep_builtin_bases():
    assert issubclass(errors.KPoolTypeError, TypeError) and issubclass(errors.KPoolTypeError, ValueError)
    assert issubclass(errors.KPoolAliasingError, errors.KPoolShapeError)
    for cls in (errors.KPoolSlotMappingError, errors.KPoolWriteConflictError, errors.KPoolBlockIdError):
        assert issubclass(cls, errors.KPoolMetadataError) and issubclass(cls, ValueError)

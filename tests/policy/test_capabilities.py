"""Policy capabilities are declared, not probed (evidence round two, item 5): BatchedPolicy forwarded
every attribute to its inner policy through __getattr__, so a capability protocol's isinstance
answered through the forwarding on Python 3.11 (hasattr) but not on 3.12+ (getattr_static)."""

import inspect

import pytest

from etude import protocols
from etude.policy.batcher import BatchedPolicy
from etude.policy.scripted import ScriptedPolicy

CAPABILITIES = [protocols.Policy, protocols.TokenPolicy, protocols.SubmitPolicy, protocols.BatchPolicy,
                protocols.NativeToolsPolicy, protocols.ModelPolicy, protocols.TokenizerPolicy,
                protocols.EngineStatsPolicy]


def _static(obj, proto) -> bool:
    """isinstance as Python 3.12+ computes it for a runtime protocol: members looked up statically."""
    import typing

    members = getattr(proto, "__protocol_attrs__", None) or typing._get_protocol_attrs(proto)  # 3.12+ / 3.11
    for m in members:
        try:
            inspect.getattr_static(obj, m)
        except AttributeError:
            return False
    return True


def test_batched_policy_forwards_nothing_it_does_not_declare():
    assert "__getattr__" not in vars(BatchedPolicy)


@pytest.mark.parametrize("proto", CAPABILITIES, ids=lambda p: p.__name__)
def test_isinstance_answers_as_python_312_would(proto):
    class Inner(ScriptedPolicy):
        def encode_prompt(self, messages):
            return [1]

    wrapped = BatchedPolicy.__new__(BatchedPolicy)  # no batcher thread: only the attributes matter
    wrapped.inner = Inner([], id="x")
    assert isinstance(wrapped, proto) == _static(wrapped, proto)

"""A background response named by the guard (vLLM stores it under the body's request_id), so that a front end knows
which stored response to follow; or refused where a deployment asks it to be while admission keeps a budget."""

from __future__ import annotations

import pytest

from proxy.api.responses import responses_request
from proxy.errors import InvalidRequest
from proxy.policy.background import admitting, named
from proxy.settings import AdmissionSettings

FOLLOW = AdmissionSettings(max_inflight_tokens=4096)


def test_a_background_request_without_an_id_gets_one_of_vllms_shape() -> None:
    req = responses_request({"model": "m", "input": "hi", "background": True})
    sent, response_id = named(req, FOLLOW)
    assert response_id is not None and response_id.startswith("resp_") and len(response_id) == 37
    assert sent.body == {"model": "m", "input": "hi", "background": True, "request_id": response_id}
    assert named(req, FOLLOW)[1] != response_id  # each its own


def test_a_clients_own_id_is_kept_and_the_body_untouched() -> None:
    req = responses_request({"model": "m", "input": "hi", "background": True, "request_id": "resp_mine"})
    assert named(req, FOLLOW) == (req, "resp_mine")


def test_a_request_in_the_foreground_is_not_followed() -> None:
    req = responses_request({"model": "m", "input": "hi", "background": False})
    assert named(req, FOLLOW) == (req, None)


def test_refuse_answers_400_only_while_admission_keeps_a_budget() -> None:
    req = responses_request({"model": "m", "input": "hi", "background": True})
    with pytest.raises(InvalidRequest, match="admission.background") as refused:
        named(req, AdmissionSettings(max_inflight_requests=4, background="refuse"))
    assert refused.value.param == "background"
    assert not admitting(AdmissionSettings(background="refuse"))
    assert named(req, AdmissionSettings(background="refuse"))[1] is not None


def test_an_id_that_is_not_a_string_is_refused_as_vllm_refuses_it() -> None:
    with pytest.raises(InvalidRequest, match="request_id"):
        responses_request({"model": "m", "input": "hi", "background": True, "request_id": 5})


@pytest.mark.parametrize("given", ["../../metrics", "resp x", "", "resp_" + "x" * 300, "resp?stream=true"])
def test_an_id_the_guard_could_not_ask_for_is_refused(given: str) -> None:
    """The guard asks the replica for it at /v1/responses/{id}: an id that is no one path segment would ask another
    route, and one the route table does not take could never be retrieved through the guard."""
    req = responses_request({"model": "m", "input": "hi", "background": True, "request_id": given})
    with pytest.raises(InvalidRequest, match="request_id") as refused:
        named(req, FOLLOW)
    assert refused.value.param == "request_id"

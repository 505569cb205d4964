import json
import logging

import pytest


@pytest.mark.django_db
def test_each_request_logs_one_json_line_with_its_session_id(owner, caplog):
    created = owner.client.post("/api/sessions", {"title": "t"}, format="json")
    session_id = created.json()["session"]["id"]
    caplog.clear()

    with caplog.at_level(logging.INFO, logger="recoup.request"):
        owner.client.get(f"/api/sessions/{session_id}")
        owner.client.get("/api/sandbox/status", {"sessionId": session_id})

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "recoup.request"]
    assert [(line["path"], line["status"], line["session_id"]) for line in lines] == [
        (f"/api/sessions/{session_id}", 200, session_id),
        ("/api/sandbox/status", 200, session_id),
    ]
    assert all(line["account_id"] == str(owner.account.id) for line in lines)

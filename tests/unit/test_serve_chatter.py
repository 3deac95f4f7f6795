"""Which of Serve's log batches a notebook does not print (raytpu_lab/serve/chatter.py)."""

from __future__ import annotations

from raytpu_lab.serve.chatter import is_serve_chatter

INFO = "INFO 2026-12-02 15:10:47,447 controller 7987 -- Deploying new version of Deployment(name='Echo', app='echo')"
ACCESS = "INFO 2026-12-02 15:10:48,001 echo_Echo abc123 -- GET /echo 200 2.1ms"
WARNING = "WARNING 2026-12-02 15:10:49,000 controller 7987 -- Deployment 'Echo' has 1 replica that has taken more than 30s to start"


def test_routine_info_of_serves_own_actors_is_chatter() -> None:
    assert is_serve_chatter({"actor_name": "ServeController", "pid": 7987, "lines": [INFO]})
    assert is_serve_chatter({"actor_name": "ProxyActor", "pid": 8035, "lines": [INFO, INFO]})
    assert is_serve_chatter({"actor_name": "ServeReplica:echo:Echo", "lines": [ACCESS]})


def test_a_warning_an_error_or_a_print_keeps_the_whole_batch() -> None:
    assert not is_serve_chatter({"actor_name": "ServeController", "lines": [INFO, WARNING]})
    assert not is_serve_chatter({"actor_name": "ServeReplica:echo:Echo",
                                 "lines": ["loading weights from /tmp/w.npy"]})
    assert not is_serve_chatter({"actor_name": "ServeReplica:echo:Echo",
                                 "lines": ["Traceback (most recent call last):"]})


def test_other_actors_and_empty_batches_are_printed() -> None:
    assert not is_serve_chatter({"actor_name": "TrainController", "lines": [INFO]})
    assert not is_serve_chatter({"pid": "raylet", "lines": [INFO]})
    assert not is_serve_chatter({"actor_name": "ProxyActor", "lines": []})

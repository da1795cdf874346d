"""A stand-in for the supervisor's side of the control socket (supervise/control_socket.py's Handler),
written as a
function of a request's op and args: the typed change it is handed goes back to its wire form
(change.py `to_wire`), so that a test says what it expects as the client sent it."""

from __future__ import annotations

from muse_launch.change import to_wire


class WireHandler:
    def __init__(self, fn):
        self.fn = fn

    def handle(self, change, leased, say):
        op, args = to_wire(change)
        return self.fn(op, args, say)

    def settle(self, commit, say):
        return self.fn("release", {"commit": commit}, say)

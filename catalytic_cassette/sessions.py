"""An in-memory working set of one session's actions, indexed by id, parent and plan."""

from __future__ import annotations

from collections import defaultdict

from .actions import Action


class SessionWorkingSet:
    def __init__(self, session_id: str, actions: list[Action]) -> None:
        self.session_id = session_id
        self.by_id: dict[str, Action] = {}
        self.children: defaultdict[str, list[str]] = defaultdict(list)
        self.by_plan: defaultdict[str, list[str]] = defaultdict(list)
        self.order: list[str] = []
        for action in actions:
            self.add(action)

    def add(self, action: Action) -> None:
        """Index a committed action (appends call this only after COMMIT)."""
        if action.action_id in self.by_id:
            return
        self.by_id[action.action_id] = action
        self.order.append(action.action_id)
        if action.parent_action_id is not None:
            self.children[action.parent_action_id].append(action.action_id)
        self.by_plan[action.plan_id].append(action.action_id)

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, action_id: object) -> bool:
        return action_id in self.by_id

    def get(self, action_id: str) -> Action | None:
        return self.by_id.get(action_id)

    def children_of(self, action_id: str) -> list[Action]:
        return [self.by_id[i] for i in self.children.get(action_id, [])]

    def plan(self, plan_id: str) -> list[Action]:
        return [self.by_id[i] for i in self.by_plan.get(plan_id, [])]

    def actions(self) -> list[Action]:
        return [self.by_id[i] for i in self.order]

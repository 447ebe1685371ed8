"""verifiers v1 tasksets posttrain must refuse, one per ``kind`` (a config field), and one
it plays (``plain``). Loaded as ``--env verifiers:vf-v1-cases?kind=...``."""

from __future__ import annotations

import verifiers.v1 as vf


class CaseData(vf.TaskData):
    answer: str


class PlainTask(vf.Task[CaseData]):
    @vf.reward
    async def exact(self, trace) -> float:
        return float(trace.last_reply == self.data.answer)


class ContainerTask(PlainTask):
    NEEDS_CONTAINER = True


class RuntimeTask(PlainTask):
    @vf.reward
    async def tests_pass(self, trace, runtime) -> float:
        result = await runtime.run("pytest -q")
        return float(result.exit_code == 0)


class ToolTask(PlainTask):
    @classmethod
    def toolsets(cls, config):
        return [vf.Toolset(vf.ToolsetConfig())]


class UnscoredTask(vf.Task[CaseData]):
    pass


class CasesConfig(vf.TasksetConfig):
    kind: str = "plain"


TASKS = {"plain": PlainTask, "container": ContainerTask, "runtime": RuntimeTask,
         "tools": ToolTask, "unscored": UnscoredTask}


class CasesTaskset(vf.Taskset[PlainTask, CasesConfig]):
    def load(self) -> list[vf.Task]:
        if self.config.kind == "messages":
            prompt = [vf.UserMessage(content="What is 2 plus 2?")]
            return [PlainTask(CaseData(prompt=prompt, answer="4"), self.config.task)]
        if self.config.kind == "systems":
            return [PlainTask(CaseData(prompt=f"What is {n} plus {n}?", answer=str(2 * n),
                                       system_prompt=f"You are calculator {n}."),
                              self.config.task) for n in (1, 2)]
        if self.config.kind == "judged":
            judged = vf.TaskConfig(judges=[{"id": "reference", "model": "judge"}])
            return [PlainTask(CaseData(prompt="What is 2 plus 2?", answer="4"), judged)]
        task_class = TASKS[self.config.kind]
        return [task_class(CaseData(prompt=f"What is {n} plus {n}?", answer=str(2 * n)),
                           self.config.task) for n in (1, 2, 3)]


__all__ = ["CasesTaskset"]

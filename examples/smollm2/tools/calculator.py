"""The calculator tool: an arithmetic expression (integers, + - * / // % and parentheses) -> its
value as text. It runs in a subprocess under limits (meshrl.algo.tool_sandbox.run_python_tool), so
even a bad expression, a huge power or a hang ends as an error observation, never a dead run."""

from __future__ import annotations

import ast
import operator

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def calc(expr: str) -> str:
    """'347 * 28' -> '9716' (an integral float prints as an integer)."""
    value = _eval(ast.parse(expr.replace("x", "*").replace("×", "*").strip(), mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)

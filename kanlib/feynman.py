"""The equations of the AI Feynman suite that the KAN paper fits: formulas, variable order and ranges.

``RunConfig.task = "feynman:<name>"`` names one (:data:`FEYNMAN`); kanlib.data generates a run's samples from it
(``FeynmanRegression``). A new equation is a line of :data:`FEYNMAN`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from kanlib.errors import ConfigError


@dataclass(frozen=True)
class FeynmanEquation:
    """One equation of the AI Feynman suite: its formula and the range each variable is drawn from.

    ``variables``: ``(name, low, high)`` in the suite's order (that order is the feature order);
    ``fn`` maps ``{name: (n,) float64 tensor}`` to the ``(n,)`` float64 target.
    """

    name: str
    output: str
    formula: str
    variables: tuple[tuple[str, float, float], ...]
    fn: Callable[[dict], torch.Tensor]

    @property
    def in_dim(self) -> int:
        return len(self.variables)

    def __call__(self, **values) -> torch.Tensor:
        """The formula at the given variable values (numbers or tensors), as a float64 tensor."""
        missing = [v for v, _, _ in self.variables if v not in values]
        if missing or len(values) != self.in_dim:
            raise ValueError(f"{self.name} takes {', '.join(v for v, _, _ in self.variables)}; got "
                             f"{', '.join(values) or 'nothing'}")
        return self.fn({k: torch.as_tensor(v, dtype=torch.float64) for k, v in values.items()})


def _eq(name, output, formula, variables, fn) -> FeynmanEquation:
    return FeynmanEquation(name, output, formula, tuple(variables), fn)


_PI = math.pi
_exp, _sin, _cos, _sqrt, _log, _asin = torch.exp, torch.sin, torch.cos, torch.sqrt, torch.log, torch.asin


def _r(low, high, *names):
    """Variables that share one range, in the given order."""
    return [(n, float(low), float(high)) for n in names]


# The equations of the KAN paper's Feynman table (Liu et al. 2024, "KAN: Kolmogorov-Arnold Networks",
# Table 2), each with the formula, variable order and sampling ranges of the AI Feynman suite
# (Udrescu & Tegmark 2020, "AI Feynman: a physics-inspired method for symbolic regression", Science
# Advances 6:eaay2631; its table FeynmanEquations.csv). The KAN paper fits dimensionless reductions of
# these equations; here every variable of the suite stays an input, on the suite's own range. The KAN
# paper calls II.11.17 "II.11.7".
FEYNMAN: dict[str, FeynmanEquation] = {e.name: e for e in [
    _eq("I.6.2", "f", "exp(-(theta/sigma)**2/2)/(sqrt(2*pi)*sigma)", _r(1, 3, "sigma", "theta"),
        lambda v: _exp(-(v["theta"] / v["sigma"]) ** 2 / 2) / (math.sqrt(2 * _PI) * v["sigma"])),
    _eq("I.6.2b", "f", "exp(-((theta-theta1)/sigma)**2/2)/(sqrt(2*pi)*sigma)",
        _r(1, 3, "sigma", "theta", "theta1"),
        lambda v: _exp(-((v["theta"] - v["theta1"]) / v["sigma"]) ** 2 / 2) / (math.sqrt(2 * _PI) * v["sigma"])),
    _eq("I.9.18", "F", "G*m1*m2/((x2-x1)**2+(y2-y1)**2+(z2-z1)**2)",
        _r(1, 2, "m1", "m2", "G") + _r(3, 4, "x1") + _r(1, 2, "x2") + _r(3, 4, "y1") + _r(1, 2, "y2")
        + _r(3, 4, "z1") + _r(1, 2, "z2"),
        lambda v: v["G"] * v["m1"] * v["m2"] / ((v["x2"] - v["x1"]) ** 2 + (v["y2"] - v["y1"]) ** 2
                                                + (v["z2"] - v["z1"]) ** 2)),
    _eq("I.12.11", "F", "q*(Ef+B*v*sin(theta))", _r(1, 5, "q", "Ef", "B", "v", "theta"),
        lambda v: v["q"] * (v["Ef"] + v["B"] * v["v"] * _sin(v["theta"]))),
    _eq("I.13.12", "U", "G*m1*m2*(1/r2-1/r1)", _r(1, 5, "m1", "m2", "r1", "r2", "G"),
        lambda v: v["G"] * v["m1"] * v["m2"] * (1 / v["r2"] - 1 / v["r1"])),
    _eq("I.15.3x", "x1", "(x-u*t)/sqrt(1-u**2/c**2)",
        _r(5, 10, "x") + _r(1, 2, "u") + _r(3, 20, "c") + _r(1, 2, "t"),
        lambda v: (v["x"] - v["u"] * v["t"]) / _sqrt(1 - v["u"] ** 2 / v["c"] ** 2)),
    _eq("I.16.6", "v1", "(u+v)/(1+u*v/c**2)", _r(1, 5, "c", "v", "u"),
        lambda v: (v["u"] + v["v"]) / (1 + v["u"] * v["v"] / v["c"] ** 2)),
    _eq("I.18.4", "r", "(m1*r1+m2*r2)/(m1+m2)", _r(1, 5, "m1", "m2", "r1", "r2"),
        lambda v: (v["m1"] * v["r1"] + v["m2"] * v["r2"]) / (v["m1"] + v["m2"])),
    _eq("I.26.2", "theta1", "arcsin(n*sin(theta2))", _r(0, 1, "n") + _r(1, 5, "theta2"),
        lambda v: _asin(v["n"] * _sin(v["theta2"]))),
    _eq("I.27.6", "foc", "1/(1/d1+n/d2)", _r(1, 5, "d1", "d2", "n"),
        lambda v: 1 / (1 / v["d1"] + v["n"] / v["d2"])),
    # (x1 - x2)^2 <= radicand: clamped at 0 so that rounding at theta1 = theta2, x1 = x2 cannot give NaN.
    _eq("I.29.16", "x", "sqrt(x1**2+x2**2-2*x1*x2*cos(theta1-theta2))", _r(1, 5, "x1", "x2", "theta1", "theta2"),
        lambda v: _sqrt((v["x1"] ** 2 + v["x2"] ** 2 - 2 * v["x1"] * v["x2"] * _cos(v["theta1"] - v["theta2"]))
                        .clamp_min(0))),
    _eq("I.30.3", "Int", "Int_0*sin(n*theta/2)**2/sin(theta/2)**2", _r(1, 5, "Int_0", "theta", "n"),
        lambda v: v["Int_0"] * _sin(v["n"] * v["theta"] / 2) ** 2 / _sin(v["theta"] / 2) ** 2),
    _eq("I.30.5", "theta", "arcsin(lambd/(n*d))", _r(1, 2, "lambd") + _r(2, 5, "d") + _r(1, 5, "n"),
        lambda v: _asin(v["lambd"] / (v["n"] * v["d"]))),
    _eq("I.37.4", "Int", "I1+I2+2*sqrt(I1*I2)*cos(delta)", _r(1, 5, "I1", "I2", "delta"),
        lambda v: v["I1"] + v["I2"] + 2 * _sqrt(v["I1"] * v["I2"]) * _cos(v["delta"])),
    _eq("I.40.1", "n", "n_0*exp(-m*g*x/(kb*T))", _r(1, 5, "n_0", "m", "x", "T", "g", "kb"),
        lambda v: v["n_0"] * _exp(-v["m"] * v["g"] * v["x"] / (v["kb"] * v["T"]))),
    _eq("I.44.4", "E_n", "n*kb*T*ln(V2/V1)", _r(1, 5, "n", "kb", "T", "V1", "V2"),
        lambda v: v["n"] * v["kb"] * v["T"] * _log(v["V2"] / v["V1"])),
    _eq("I.50.26", "x", "x1*(cos(omega*t)+alpha*cos(omega*t)**2)", _r(1, 3, "x1", "omega", "t", "alpha"),
        lambda v: v["x1"] * (_cos(v["omega"] * v["t"]) + v["alpha"] * _cos(v["omega"] * v["t"]) ** 2)),
    _eq("II.2.42", "Pwr", "kappa*(T2-T1)*A/d", _r(1, 5, "kappa", "T1", "T2", "A", "d"),
        lambda v: v["kappa"] * (v["T2"] - v["T1"]) * v["A"] / v["d"]),
    _eq("II.6.15a", "Ef", "p_d/(4*pi*epsilon)*3*z/r**5*sqrt(x**2+y**2)",
        _r(1, 3, "epsilon", "p_d", "r", "x", "y", "z"),
        lambda v: v["p_d"] / (4 * _PI * v["epsilon"]) * 3 * v["z"] / v["r"] ** 5 * _sqrt(v["x"] ** 2 + v["y"] ** 2)),
    _eq("II.11.17", "n", "n_0*(1+p_d*Ef*cos(theta)/(kb*T))", _r(1, 3, "n_0", "kb", "T", "theta", "p_d", "Ef"),
        lambda v: v["n_0"] * (1 + v["p_d"] * v["Ef"] * _cos(v["theta"]) / (v["kb"] * v["T"]))),
    _eq("II.11.27", "Pol", "n*alpha/(1-(n*alpha/3))*epsilon*Ef",
        _r(0, 1, "n", "alpha") + _r(1, 2, "epsilon", "Ef"),
        lambda v: v["n"] * v["alpha"] / (1 - v["n"] * v["alpha"] / 3) * v["epsilon"] * v["Ef"]),
    _eq("II.35.18", "n", "n_0/(exp(mom*B/(kb*T))+exp(-mom*B/(kb*T)))", _r(1, 3, "n_0", "kb", "T", "mom", "B"),
        lambda v: v["n_0"] / (_exp(v["mom"] * v["B"] / (v["kb"] * v["T"]))
                              + _exp(-v["mom"] * v["B"] / (v["kb"] * v["T"])))),
    _eq("II.36.38", "f", "mom*H/(kb*T)+(mom*alpha)/(epsilon*c**2*kb*T)*M",
        _r(1, 3, "mom", "H", "kb", "T", "alpha", "epsilon", "c", "M"),
        lambda v: v["mom"] * v["H"] / (v["kb"] * v["T"])
        + v["mom"] * v["alpha"] / (v["epsilon"] * v["c"] ** 2 * v["kb"] * v["T"]) * v["M"]),
    _eq("II.38.3", "F", "Y*A*x/d", _r(1, 5, "Y", "A", "d", "x"),
        lambda v: v["Y"] * v["A"] * v["x"] / v["d"]),
    # sin(a)^2 / a^2 with a = (omega - omega_0) t / 2 is written as sinc(a / pi)^2 (torch.sinc is the
    # normalised sin(pi z) / (pi z)): the same function, and 1 instead of 0/0 where omega = omega_0.
    _eq("III.9.52", "prob", "(p_d*Ef*t/(h/(2*pi)))*sin((omega-omega_0)*t/2)**2/((omega-omega_0)*t/2)**2",
        _r(1, 3, "p_d", "Ef", "t", "h") + _r(1, 5, "omega", "omega_0"),
        lambda v: v["p_d"] * v["Ef"] * v["t"] / (v["h"] / (2 * _PI))
        * torch.sinc((v["omega"] - v["omega_0"]) * v["t"] / 2 / _PI) ** 2),
    _eq("III.10.19", "E_n", "mom*sqrt(Bx**2+By**2+Bz**2)", _r(1, 5, "mom", "Bx", "By", "Bz"),
        lambda v: v["mom"] * _sqrt(v["Bx"] ** 2 + v["By"] ** 2 + v["Bz"] ** 2)),
    _eq("III.17.37", "f", "beta*(1+alpha*cos(theta))", _r(1, 5, "beta", "alpha", "theta"),
        lambda v: v["beta"] * (1 + v["alpha"] * _cos(v["theta"]))),
]}

FEYNMAN_PREFIX = "feynman:"


def feynman_equation(task: str) -> FeynmanEquation:
    """The equation of ``task = "feynman:<name>"``; an unknown name lists the known ones."""
    name = task[len(FEYNMAN_PREFIX):]
    if name not in FEYNMAN:
        raise ConfigError(f"task: unknown Feynman equation {name!r} in {task!r}; known: {', '.join(FEYNMAN)}")
    return FEYNMAN[name]

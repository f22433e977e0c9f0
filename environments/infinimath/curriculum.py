"""Seven levels of procedurally generated math problems, from the ``mathgenerator`` package.

Each level is a set of mathgenerator generators (named below, identified at run time by
mathgenerator's generator ids, which is how problems are recorded); `MathCurriculum`
draws problems at its current level, records which ones were solved and moves up one
level once the last ``min_evaluations`` results at the current level reach
``progress_threshold``.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Optional

import mathgenerator

log = logging.getLogger(__name__)

# Level -> mathgenerator generator names (the `funcname` column of mathgenerator.getGenList()).
LEVEL_GENERATORS: dict[int, tuple[str, ...]] = {
    1: ("addition", "subtraction", "multiplication", "division", "square", "factorial", "absolute_difference",
        "percentage", "is_prime"),
    2: ("square_root", "basic_algebra", "fraction_to_decimal", "divide_fractions", "fraction_multiplication",
        "compare_fractions", "cube_root", "exponentiation", "power_of_powers", "percentage_difference",
        "percentage_error", "is_composite"),
    3: ("area_of_triangle", "valid_triangle", "third_angle_of_triangle", "distance_two_points",
        "pythagorean_theorem", "fourth_angle_of_quadrilateral", "sum_of_polygon_angles", "sector_area",
        "perimeter_of_polygons", "circumference", "arc_length", "area_of_circle",
        "area_of_circle_given_center_and_point"),
    4: ("lcm", "gcd", "midpoint_of_two_points", "factoring", "system_of_equations", "linear_equations",
        "common_factors", "intersection_of_two_lines", "simple_interest", "quadratic_equation", "mean_median",
        "compound_interest", "combine_like_terms"),
    5: ("multiply_int_to_22_matrix", "surface_area_cube", "surface_area_cuboid", "surface_area_cylinder",
        "volume_cube", "volume_cuboid", "volume_cylinder", "surface_area_cone", "volume_cone", "vector_cross",
        "matrix_multiplication", "surface_area_sphere", "volume_sphere", "angle_btw_vectors", "vector_dot",
        "int_matrix_22_determinant", "curved_surface_area_cylinder", "volume_frustum", "volume_hemisphere",
        "volume_pyramid", "surface_area_pyramid"),
    6: ("binary_complement_1s", "modulo_division", "power_rule_differentiation", "log", "decimal_to_binary",
        "binary_to_decimal", "prime_factors", "combinations", "permutation", "power_rule_integration",
        "dice_sum_probability", "confidence_interval", "surds_comparison", "fibonacci_series", "data_summary",
        "nth_fibonacci_number", "binary_to_hex", "binary_2s_complement", "decimal_to_hexadeci", "decimal_to_octal",
        "trig_differentiation", "definite_integral", "bcd_to_decimal", "decimal_to_bcd", "conditional_probability",
        "stationary_points"),
    7: ("multiply_complex_numbers", "geometric_progression", "geometric_mean", "harmonic_mean", "euclidian_norm",
        "invert_matrix", "decimal_to_roman_numerals", "complex_to_polar", "set_operation", "base_conversion",
        "quotient_of_power_same_base", "quotient_of_power_same_power", "complex_quadratic", "is_leap_year",
        "signum_function", "binomial_distribution", "expanding", "product_of_scientific_notations"),
}

LEVEL_DESCRIPTIONS = {
    1: "Arithmetic: the four operations, squares, factorials, percentages, primes",
    2: "Fractions, roots, powers and first algebra",
    3: "Plane geometry: triangles, polygons, circles",
    4: "Algebra and simple statistics: equations, factoring, interest, mean and median",
    5: "Vectors, 2x2 matrices and solid geometry",
    6: "Calculus, probability, statistics and number representations",
    7: "Complex numbers, matrix inverses, sequences and other advanced topics",
}

FALLBACK_PROBLEM = ("What is $2 + 2$?", "4", 0)


def _ids_by_name() -> dict[str, int]:
    return {entry[3]: entry[0] for entry in mathgenerator.getGenList()}


def _level_ids() -> dict[int, list[int]]:
    ids = _ids_by_name()
    missing = sorted(name for names in LEVEL_GENERATORS.values() for name in names if name not in ids)
    if missing:
        log.warning("this mathgenerator has no generator named %s: left out of the curriculum", ", ".join(missing))
    return {level: [ids[name] for name in names if name in ids] for level, names in LEVEL_GENERATORS.items()}


class MathCurriculum:
    """Problems at a current level that rises when the learner keeps solving them."""

    DIFFICULTY_LEVELS: dict[int, list[int]] = _level_ids()

    def __init__(self, starting_level: int = 1, progress_threshold: float = 0.8, min_evaluations: int = 5,
                 rng: Optional[random.Random] = None) -> None:
        if starting_level not in self.DIFFICULTY_LEVELS:
            raise ValueError(f"no level {starting_level}; levels are {sorted(self.DIFFICULTY_LEVELS)}")
        self.current_level = starting_level
        self.progress_threshold = progress_threshold
        self.min_evaluations = min_evaluations
        self.rng = rng or random.Random()
        self.performance_history: dict[int, list[bool]] = {level: [] for level in self.DIFFICULTY_LEVELS}
        self.broken_generators: set[int] = set()

    def level_of(self, generator_id: int) -> Optional[int]:
        """The level a generator belongs to (None for ids outside the curriculum)."""
        for level, ids in self.DIFFICULTY_LEVELS.items():
            if generator_id in ids:
                return level
        return None

    def get_problem(self) -> tuple[str, str, int]:
        """(problem, solution, generator id) from a random generator of the current level.

        A generator that raises is not used again by this curriculum; when a level has none
        left, a neighbouring level's are used; after five failures a fixed problem is returned.
        """
        level = self.current_level
        for _ in range(5):
            usable = [g for g in self.DIFFICULTY_LEVELS.get(level, []) if g not in self.broken_generators]
            if not usable:
                level = max(1, min(len(self.DIFFICULTY_LEVELS), level + self.rng.choice((-1, 1))))
                continue
            generator_id = self.rng.choice(usable)
            try:
                problem, solution = mathgenerator.genById(generator_id)
            except Exception as exc:
                log.warning("mathgenerator generator %d failed (%s): not used again", generator_id, exc)
                self.broken_generators.add(generator_id)
                continue
            return str(problem), str(solution), generator_id
        return FALLBACK_PROBLEM

    def record_performance(self, generator_id: int, is_correct: bool) -> None:
        level = self.level_of(generator_id)
        if level is not None:
            self.performance_history.setdefault(level, []).append(bool(is_correct))

    def get_success_rate(self, level: int) -> Optional[float]:
        """Share of the last `min_evaluations` results at `level` that were right (None: too few)."""
        history = self.performance_history.get(level, [])
        if len(history) < self.min_evaluations:
            return None
        recent = history[-self.min_evaluations:] if self.min_evaluations > 0 else history
        return sum(recent) / len(recent) if recent else None

    def should_advance(self) -> bool:
        rate = self.get_success_rate(self.current_level)
        return rate is not None and rate >= self.progress_threshold and self.current_level < max(self.DIFFICULTY_LEVELS)

    def advance_difficulty(self) -> bool:
        """Move up one level if `should_advance()`; whether it moved."""
        if not self.should_advance():
            return False
        self.current_level += 1
        return True

    def get_current_level(self) -> int:
        return self.current_level

    def get_num_levels(self) -> int:
        return len(self.DIFFICULTY_LEVELS)

    def get_level_description(self, level: Optional[int] = None) -> str:
        level = self.current_level if level is None else level
        return LEVEL_DESCRIPTIONS.get(level, f"level {level}: generators {self.DIFFICULTY_LEVELS.get(level, [])}")

    def reset(self, level: int = 1) -> None:
        """Back to `level` with no recorded results."""
        if level not in self.DIFFICULTY_LEVELS:
            raise ValueError(f"no level {level}; levels are {sorted(self.DIFFICULTY_LEVELS)}")
        self.current_level = level
        self.performance_history = {lvl: [] for lvl in self.DIFFICULTY_LEVELS}

    def get_generator_info(self) -> list[dict[str, Any]]:
        """Every mathgenerator generator with its level in this curriculum (None: not used)."""
        return [{"id": entry[0], "name": entry[1], "function": entry[3], "subject": entry[4], "params": entry[5],
                 "difficulty_level": self.level_of(entry[0])} for entry in mathgenerator.getGenList()]

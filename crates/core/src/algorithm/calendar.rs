//! Calendar windows: fixed windows aligned to the UTC calendar (a day from 00:00, an ISO week
//! from Monday 00:00, a month from the 1st 00:00) instead of to multiples of a length since
//! the epoch. "10,000 per month" means per calendar month, and a month is 28 to 31 days long,
//! so its window cannot be a fixed length.
//!
//! The boundaries are pure integer arithmetic on days since the epoch (the days-from-civil and
//! civil-from-days algorithms for the proleptic Gregorian calendar), so the Lua scripts
//! compute the very same boundaries from the Redis server's `TIME` (`lua/common.lua`,
//! `calendar_bounds`). Counting within the window is [`super::fixed_window`]'s.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Milliseconds in a day.
pub const DAY_MS: u64 = 86_400_000;

/// A calendar period in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CalendarPeriod {
    /// 00:00 to 00:00 UTC.
    Day,
    /// ISO week: Monday 00:00 UTC to the next Monday.
    Week,
    /// The 1st 00:00 UTC to the 1st of the next month.
    Month,
}

impl CalendarPeriod {
    /// The code the Lua scripts receive (0 is a plain fixed window).
    pub fn lua_code(self) -> u64 {
        match self {
            CalendarPeriod::Day => 1,
            CalendarPeriod::Week => 2,
            CalendarPeriod::Month => 3,
        }
    }

    /// The longest window of the period, ms (a month of 31 days): the bound used for exact
    /// arithmetic and as the window shown in `RateLimit-Policy` (`w`).
    pub fn max_ms(self) -> u64 {
        match self {
            CalendarPeriod::Day => DAY_MS,
            CalendarPeriod::Week => 7 * DAY_MS,
            CalendarPeriod::Month => 31 * DAY_MS,
        }
    }

    /// `[start, end)` of the period holding `now_ms` (ms since the epoch, UTC).
    pub fn bounds(self, now_ms: u64) -> (u64, u64) {
        let day = (now_ms / DAY_MS) as i64;
        let (start, end) = match self {
            CalendarPeriod::Day => (day, day + 1),
            CalendarPeriod::Week => {
                // 1970-01-01 was a Thursday: Monday-based weekday = (day + 3) mod 7.
                let monday = day - (day + 3).rem_euclid(7);
                (monday, monday + 7)
            }
            CalendarPeriod::Month => {
                let (y, m, _) = civil_from_days(day);
                let next = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (days_from_civil(y, m, 1), days_from_civil(next.0, next.1, 1))
            }
        };
        (start as u64 * DAY_MS, end as u64 * DAY_MS)
    }

    /// Reads `1 day`, `1 week`, `1 month` (also `day`, `week`, `month`, `1day`...).
    /// `None` for anything else (a plain duration, or not a window at all).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        let unit = s.strip_prefix('1').unwrap_or(&s).trim();
        match unit {
            "day" => Some(CalendarPeriod::Day),
            "week" => Some(CalendarPeriod::Week),
            "month" => Some(CalendarPeriod::Month),
            _ => None,
        }
    }
}

impl fmt::Display for CalendarPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CalendarPeriod::Day => "1 day",
            CalendarPeriod::Week => "1 week",
            CalendarPeriod::Month => "1 month",
        })
    }
}

/// Days since 1970-01-01 of the date `y-m-d` (proleptic Gregorian).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = (i64::from(m) + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// The date `(y, m, d)` of `days` since 1970-01-01 (proleptic Gregorian).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // March = 0
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ms of `y-m-d hh:mm:ss` UTC.
    fn at(y: i64, m: u32, d: u32, hms: (u64, u64, u64)) -> u64 {
        days_from_civil(y, m, d) as u64 * DAY_MS + (hms.0 * 3600 + hms.1 * 60 + hms.2) * 1000
    }

    #[test]
    fn civil_round_trips_and_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        // 2024-02-29T00:00:00Z = 1709164800 s.
        assert_eq!(at(2024, 2, 29, (0, 0, 0)), 1_709_164_800_000);
        for day in (0..200_000).step_by(7) {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }

    #[test]
    fn month_bounds_follow_month_lengths_and_leap_years() {
        let m = CalendarPeriod::Month;
        let jan31 = at(2026, 1, 31, (23, 59, 59));
        assert_eq!(
            m.bounds(jan31),
            (at(2026, 1, 1, (0, 0, 0)), at(2026, 2, 1, (0, 0, 0)))
        );
        assert_eq!(m.bounds(jan31 + 1000).0, at(2026, 2, 1, (0, 0, 0)));
        // February: 28 days in 2026 and 2100, 29 in 2024 and 2000.
        for (y, days) in [(2026, 28), (2024, 29), (2100, 28), (2000, 29)] {
            let (s, e) = m.bounds(at(y, 2, 10, (12, 0, 0)));
            assert_eq!((e - s) / DAY_MS, days, "{y}");
        }
        let (s, e) = m.bounds(at(2024, 2, 29, (23, 59, 59)));
        assert_eq!(
            (s, e),
            (at(2024, 2, 1, (0, 0, 0)), at(2024, 3, 1, (0, 0, 0)))
        );
        let (s, e) = m.bounds(at(2025, 12, 31, (23, 0, 0)));
        assert_eq!(
            (s, e),
            (at(2025, 12, 1, (0, 0, 0)), at(2026, 1, 1, (0, 0, 0)))
        );
    }

    #[test]
    fn weeks_start_on_monday_and_days_at_midnight() {
        // 2026-01-01 is a Thursday; its ISO week starts Monday 2025-12-29.
        let thu = at(2026, 1, 1, (8, 0, 0));
        assert_eq!(
            CalendarPeriod::Week.bounds(thu),
            (at(2025, 12, 29, (0, 0, 0)), at(2026, 1, 5, (0, 0, 0)))
        );
        let mon = at(2026, 1, 5, (0, 0, 0));
        assert_eq!(CalendarPeriod::Week.bounds(mon).0, mon);
        assert_eq!(
            CalendarPeriod::Day.bounds(thu),
            (at(2026, 1, 1, (0, 0, 0)), at(2026, 1, 2, (0, 0, 0)))
        );
    }

    #[test]
    fn parses_calendar_spellings_only() {
        for (s, p) in [
            ("1 month", CalendarPeriod::Month),
            ("month", CalendarPeriod::Month),
            ("1 Week", CalendarPeriod::Week),
            ("1day", CalendarPeriod::Day),
        ] {
            assert_eq!(CalendarPeriod::parse(s), Some(p), "{s}");
        }
        for s in ["1d", "2 months", "10 month", "30d", "1 mon"] {
            assert_eq!(CalendarPeriod::parse(s), None, "{s}");
        }
    }
}

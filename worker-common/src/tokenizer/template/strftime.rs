//! `strftime_now(format)`: the current date and time, formatted as C's `strftime` formats it.
//!
//! llama.cpp's server gives chat templates this function (gpt-oss's writes `Current date:
//! {{ strftime_now("%Y-%m-%d") }}`, Llama 3.x's `strftime_now("%d %b %Y")`). It formats the
//! local time there; here it is UTC, because the worker has no time-zone database (no new
//! dependency) and a worker's zone says nothing about its caller's anyway. Names are C
//! locale's (English). A conversion outside the supported set fails the render with a clear
//! message instead of printing something a template did not mean.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Error, ErrorKind, Value};

use crate::calendar::civil_from_days;

const SECONDS_PER_DAY: i64 = 86_400;

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Sunday first, as C's `tm_wday` counts.
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// Why a format string cannot be formatted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum StrftimeError {
    /// A `%` conversion this implementation does not provide.
    #[error("strftime_now: unsupported conversion %{0}")]
    Unsupported(char),
    /// The format ends with a lone `%`.
    #[error("strftime_now: the format ends with a lone %")]
    Trailing,
}

/// A UTC instant broken down into calendar fields (C's `struct tm`, 1-based where people
/// count from one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    /// 1..=12.
    month: u32,
    /// 1..=31.
    day: u32,
    /// 0..=23.
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Sunday.
    weekday: u32,
    /// 1..=366.
    yearday: u32,
}

impl Civil {
    /// The calendar fields of `unix_seconds` (seconds since 1970-01-01T00:00:00Z, negative
    /// before it), in the proleptic Gregorian calendar.
    fn from_unix(unix_seconds: i64) -> Self {
        let days = unix_seconds.div_euclid(SECONDS_PER_DAY);
        let in_day = unix_seconds.rem_euclid(SECONDS_PER_DAY) as u32;
        let (year, month, day) = civil_from_days(days);
        let leap = is_leap(year);
        let before_month: u32 = (1..month).map(|m| days_in_month(m, leap)).sum();
        Self {
            year,
            month,
            day,
            hour: in_day / 3600,
            minute: in_day / 60 % 60,
            second: in_day % 60,
            // 1970-01-01 was a Thursday.
            weekday: (days + 4).rem_euclid(7) as u32,
            yearday: before_month + day,
        }
    }
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(month: u32, leap: bool) -> u32 {
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `format` as C's `strftime` writes it for `unix_seconds` in UTC. Supported conversions:
/// `%Y %y %m %d %e %j %H %I %M %S %p %b %h %B %a %A %F %T %n %t %%`.
pub(super) fn format(format: &str, unix_seconds: i64) -> Result<String, StrftimeError> {
    let tm = Civil::from_unix(unix_seconds);
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let conversion = chars.next().ok_or(StrftimeError::Trailing)?;
        convert(&mut out, &tm, conversion)?;
    }
    Ok(out)
}

/// Appends one conversion's text.
fn convert(out: &mut String, tm: &Civil, conversion: char) -> Result<(), StrftimeError> {
    let month_name = MONTHS[(tm.month - 1) as usize];
    let weekday_name = WEEKDAYS[tm.weekday as usize];
    let text = match conversion {
        'Y' => tm.year.to_string(),
        'y' => format!("{:02}", tm.year.rem_euclid(100)),
        'm' => format!("{:02}", tm.month),
        'd' => format!("{:02}", tm.day),
        'e' => format!("{:2}", tm.day),
        'j' => format!("{:03}", tm.yearday),
        'H' => format!("{:02}", tm.hour),
        // The 12-hour clock: midnight and noon are 12.
        'I' => format!("{:02}", (tm.hour + 11) % 12 + 1),
        'M' => format!("{:02}", tm.minute),
        'S' => format!("{:02}", tm.second),
        'p' => (if tm.hour < 12 { "AM" } else { "PM" }).to_owned(),
        'b' | 'h' => month_name[..3].to_owned(),
        'B' => month_name.to_owned(),
        'a' => weekday_name[..3].to_owned(),
        'A' => weekday_name.to_owned(),
        'F' => format!("{}-{:02}-{:02}", tm.year, tm.month, tm.day),
        'T' => format!("{:02}:{:02}:{:02}", tm.hour, tm.minute, tm.second),
        'n' => "\n".to_owned(),
        't' => "\t".to_owned(),
        '%' => "%".to_owned(),
        other => return Err(StrftimeError::Unsupported(other)),
    };
    out.push_str(&text);
    Ok(())
}

/// Seconds since the Unix epoch now (negative if the clock is set before it).
fn unix_now() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// The template function `strftime_now(format)`: the current UTC time in `format`.
pub(super) fn strftime_now(format_string: String) -> Result<Value, Error> {
    format(&format_string, unix_now())
        .map(Value::from)
        .map_err(|err| Error::new(ErrorKind::InvalidOperation, err.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// 2024-02-29T13:05:09Z, a Thursday: a leap day, an afternoon hour.
    const LEAP_DAY: i64 = 1_709_211_909;

    #[test]
    fn every_conversion_on_a_fixed_instant() {
        let all = "%Y %y %m %d %e %j %H %I %M %S %p %b %h %B %a %A %F %T %%";
        assert_eq!(
            format(all, LEAP_DAY).unwrap(),
            "2024 24 02 29 29 060 13 01 05 09 PM Feb Feb February Thu Thursday \
             2024-02-29 13:05:09 %"
        );
        assert_eq!(format("%n%t", LEAP_DAY).unwrap(), "\n\t");
    }

    #[test]
    fn the_templates_formats() {
        assert_eq!(format("%Y-%m-%d", LEAP_DAY).unwrap(), "2024-02-29");
        assert_eq!(format("%d %b %Y", LEAP_DAY).unwrap(), "29 Feb 2024");
        assert_eq!(
            format("no conversions", LEAP_DAY).unwrap(),
            "no conversions"
        );
        assert_eq!(format("", LEAP_DAY).unwrap(), "");
    }

    #[test]
    fn epoch_midnight_padding_and_year_end() {
        assert_eq!(
            format("%F %T %a %I %p %e %j", 0).unwrap(),
            "1970-01-01 00:00:00 Thu 12 AM  1 001"
        );
        // 2023-12-31T23:59:59Z: day 365 of a common year, a Sunday.
        assert_eq!(
            format("%F %T %A %j %I", 1_704_067_199).unwrap(),
            "2023-12-31 23:59:59 Sunday 365 11"
        );
        // 2000-12-31 was day 366 of a leap century year; 1900 was not leap (its 1 March).
        assert_eq!(format("%j", 978_220_800).unwrap(), "366");
        assert_eq!(format("%F %a", -2_203_891_200).unwrap(), "1900-03-01 Thu");
        assert_eq!(format("%F %T", -1).unwrap(), "1969-12-31 23:59:59");
    }

    #[test]
    fn days_agree_with_a_day_by_day_walk() {
        // Walk the calendar one day at a time across several leap rules and compare.
        let (mut year, mut month, mut day) = (1896_i64, 1_u32, 1_u32);
        let start = -(74 * 365 + 18) * SECONDS_PER_DAY; // 1896-01-01
        for n in 0..(220 * 366) {
            let tm = Civil::from_unix(start + n * SECONDS_PER_DAY);
            assert_eq!((tm.year, tm.month, tm.day), (year, month, day), "day {n}");
            day += 1;
            if day > days_in_month(month, is_leap(year)) {
                (day, month) = (1, month + 1);
                if month > 12 {
                    (month, year) = (1, year + 1);
                }
            }
        }
    }

    #[test]
    fn unsupported_conversions_are_errors_not_panics() {
        assert_eq!(format("%Q", 0), Err(StrftimeError::Unsupported('Q')));
        assert_eq!(format("%Y %", 0), Err(StrftimeError::Trailing));
        assert_eq!(format("%é", 0), Err(StrftimeError::Unsupported('é')));
        let err = strftime_now("%Y %Z".into()).unwrap_err();
        assert!(
            err.to_string().contains("unsupported conversion %Z"),
            "{err}"
        );
        // The extremes of the clock do not overflow.
        for seconds in [i64::MIN, i64::MAX] {
            assert!(format("%F %T %j %a", seconds).is_ok());
        }
    }

    #[test]
    fn now_is_a_plausible_date() {
        let now = strftime_now("%Y".into()).unwrap();
        let year: i64 = now.as_str().unwrap().parse().unwrap();
        assert!(year >= 2025, "{year}");
    }
}

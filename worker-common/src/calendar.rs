//! The proleptic Gregorian calendar of Unix days, for timestamps written without a date-time
//! crate (chat templates' `strftime_now`, the HTTP layer's RFC 3339 times).

/// Year, month (1..=12) and day (1..=31) of a day count since 1970-01-01: Howard Hinnant's
/// `civil_from_days`, exact over the whole `i64` range of days we can be given.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift to 0000-03-01 so that a leap day is the last day of its (March-based) year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

//! The tuner's environment variables: a bad value is an error naming the
//! variable, not silently replaced. (A process of its own: it sets variables.)

use std::time::Duration;
use tilefuse_runtime::autotune::Effort;

#[test]
fn the_tuning_budget_comes_from_the_level_or_a_valid_override() {
    std::env::remove_var("TILEFUSE_AUTOTUNE_BUDGET_S");
    assert_eq!(Effort::Quick.budget().unwrap(), Duration::from_secs(20));
    assert_eq!(Effort::Full.budget().unwrap(), Duration::from_secs(300));
    std::env::set_var("TILEFUSE_AUTOTUNE_BUDGET_S", "2.5");
    assert_eq!(Effort::Quick.budget().unwrap(), Duration::from_millis(2500));
    for bad in ["soon", "-3", "0", "inf"] {
        std::env::set_var("TILEFUSE_AUTOTUNE_BUDGET_S", bad);
        let e = Effort::Full.budget().unwrap_err().to_string();
        assert!(
            e.contains("TILEFUSE_AUTOTUNE_BUDGET_S") && e.contains(bad),
            "{bad}: {e}"
        );
    }
    std::env::remove_var("TILEFUSE_AUTOTUNE_BUDGET_S");
}

#[test]
fn the_level_comes_from_the_variable_and_a_bad_one_is_named() {
    use tilefuse_runtime::autotune::effort;
    for (v, want) in [
        ("off", Effort::Off),
        ("cached", Effort::Cached),
        ("Quick", Effort::Quick),
        ("full", Effort::Full),
    ] {
        std::env::set_var("TILEFUSE_AUTOTUNE", v);
        assert_eq!(effort().unwrap(), want, "{v}");
    }
    std::env::set_var("TILEFUSE_AUTOTUNE", "sometimes");
    let e = effort().unwrap_err().to_string();
    assert!(
        e.contains("TILEFUSE_AUTOTUNE") && e.contains("cached"),
        "{e}"
    );
    std::env::remove_var("TILEFUSE_AUTOTUNE");
}

//! Prints what this kernel offers vrange and what falls back.
fn main() {
    print!("{}", vrange::features());
}

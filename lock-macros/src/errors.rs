//! Compile errors gathered instead of stopped at.
//!
//! The attribute reports every mistake it finds in one go: each step of parsing and checking
//! adds its errors here and goes on with what it could read. The errors keep the order in
//! which they were found, which is the order rustc shows them in.

/// The errors found so far, in order.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    /// Adds `error` after the ones found before it.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(errors) => errors.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// The value of `result`; its error, if any, is added and the step goes on without it.
    pub(crate) fn take<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|error| self.push(error)).ok()
    }

    /// `result` as it is, with its error (if any) also added here, in its place among the
    /// others: for a value whose absence a later step has to answer for.
    pub(crate) fn keep<T>(&mut self, result: syn::Result<T>) -> syn::Result<T> {
        if let Err(error) = &result {
            self.push(error.clone());
        }
        result
    }

    /// `value` when nothing was found, else every error.
    pub(crate) fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.0 {
            Some(errors) => Err(errors),
            None => Ok(value),
        }
    }

    /// Every error, `last` added at the end, for a step that cannot go on because of `last`.
    pub(crate) fn fail(self, last: syn::Error) -> syn::Error {
        match self.0 {
            Some(mut errors) => {
                errors.combine(last);
                errors
            }
            None => last,
        }
    }

    /// Every error, for a step that cannot go on because of `kept`: an error added by
    /// [`Errors::keep`], so already among them.
    pub(crate) fn stop(self, kept: syn::Error) -> syn::Error {
        self.0.unwrap_or(kept)
    }
}

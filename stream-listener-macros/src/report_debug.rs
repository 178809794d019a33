//! `#[derive(ReportDebug)]`: an error's `Debug` that prints its report (`{:?}`, what `fn main() ->
//! Result<(), E>` shows) or its structure (`{:#?}`, the fields, as `#[derive(Debug)]` would). For the
//! runtime crate's own error types only: the expansion names its `crate::report`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{Data, DeriveInput, Fields};

pub(crate) fn expand(input: DeriveInput) -> TokenStream {
    let name = &input.ident;
    let (impl_generics, type_generics, where_clause) = input.generics.split_for_impl();
    let arms: Vec<TokenStream> = match &input.data {
        Data::Struct(data) => vec![arm(quote!(Self), &name.to_string(), &data.fields)],
        Data::Enum(data) => data
            .variants
            .iter()
            .map(|variant| {
                let ident = &variant.ident;
                arm(quote!(Self::#ident), &ident.to_string(), &variant.fields)
            })
            .collect(),
        Data::Union(_) => {
            return syn::Error::new_spanned(name, "ReportDebug is for structs and enums")
                .to_compile_error()
        }
    };
    quote! {
        impl #impl_generics ::core::fmt::Debug for #name #type_generics #where_clause {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                if !f.alternate() {
                    return crate::report::report(self, f);
                }
                match self {
                    #(#arms)*
                }
            }
        }
    }
}

/// `pattern => structural Debug` for one struct or variant, named `label`.
fn arm(path: TokenStream, label: &str, fields: &Fields) -> TokenStream {
    match fields {
        Fields::Named(named) => {
            let names: Vec<_> = named.named.iter().filter_map(|f| f.ident.clone()).collect();
            let labels = names.iter().map(ToString::to_string);
            quote! {
                #path { #(#names),* } => f.debug_struct(#label) #(.field(#labels, #names))* .finish(),
            }
        }
        Fields::Unnamed(unnamed) => {
            let names: Vec<_> = (0..unnamed.unnamed.len())
                .map(|i| format_ident!("field_{i}"))
                .collect();
            quote! {
                #path ( #(#names),* ) => f.debug_tuple(#label) #(.field(#names))* .finish(),
            }
        }
        Fields::Unit => quote! { #path => f.write_str(#label), },
    }
}

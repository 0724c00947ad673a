import type {
	IAuthenticateGeneric,
	ICredentialTestRequest,
	ICredentialType,
	INodeProperties,
} from 'n8n-workflow';

export class WerkApi implements ICredentialType {
	name = 'werkApi';

	displayName = 'Werk API';

	icon = { light: 'file:../icons/werk.svg', dark: 'file:../icons/werk.dark.svg' } as const;

	documentationUrl = 'https://github.com/werk-ai/werk/blob/main/docs/integrations.md#n8n';

	properties: INodeProperties[] = [
		{
			displayName: 'Base URL',
			name: 'baseUrl',
			type: 'string',
			default: 'http://127.0.0.1:11434',
			placeholder: 'http://127.0.0.1:11434',
			description: 'Where werk serve listens',
			required: true,
		},
		{
			displayName: 'API Key',
			name: 'apiKey',
			type: 'string',
			typeOptions: { password: true },
			default: '',
			description: 'One of the keys werk serve was started with; empty for a server without keys',
		},
		{
			displayName: 'Allow Experimental',
			name: 'allowExperimental',
			type: 'boolean',
			default: false,
			description:
				'Whether to use capabilities Werk reports as experimental (split prefill/decode and named states of llama.cpp until proven, MoE expert moves). Off: Werk refuses them and the expert operations are not offered.',
		},
	];

	authenticate: IAuthenticateGeneric = {
		type: 'generic',
		properties: {
			headers: {
				Authorization: '={{$credentials.apiKey ? "Bearer " + $credentials.apiKey : ""}}',
			},
		},
	};

	test: ICredentialTestRequest = {
		request: {
			baseURL: '={{$credentials.baseUrl.replace(/\\/+$/, "")}}',
			url: '/werk/v1/info',
		},
	};
}
